"""The command as a newcomer meets it (docs/cli.md), through the installed console script: threads,
benchmark spread, reproducible default output, statistics, errors before work, Ctrl-C, offline-first
default draft, startup without torch, messages, the demo's output, and the test-time split."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_fixtures import claiming_7b, interruptible
from tiny_models import tiny_model

from assisted_backends.backends.cpu import affinity
from assisted_backends.cli.args import cli_spelling
from assisted_backends.cli.report import describe_stats
from assisted_backends.cli.spread import is_settled, median_interval, run_pairs
from assisted_backends.demo.corpus import read_corpus
from assisted_backends.demo.tokenizer import train_tokenizer
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.extras import install_hint
from assisted_backends.options.errors import OptionError

ROOT = Path(__file__).resolve().parents[2]
CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _script() -> str:
    beside = Path(sys.executable).parent / "run-assisted-generation"
    found = str(beside) if beside.is_file() else shutil.which("run-assisted-generation")
    assert found, "console script run-assisted-generation is not installed: pip install -e ."
    return found


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE")}
    env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra})
    return {k: v for k, v in env.items() if v != ""}


def _cli(*argv: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([_script(), *argv], capture_output=True, text=True, env=_env(**env), timeout=timeout)


def _one_line_error(run: subprocess.CompletedProcess, *needles: str) -> None:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "Loading weights" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, last


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Llama target and a perturbed-copy draft, saved with a locally trained tokenizer."""
    root = tmp_path_factory.mktemp("newcomer")
    tokenizer = train_tokenizer(read_corpus(60_000)[0], 300)
    target = tiny_model("llama", seed=0, vocab=len(tokenizer), init=0.1)
    draft = tiny_model("llama", seed=0, vocab=len(tokenizer), init=0.1)
    with torch.no_grad():
        for weight in draft.parameters():
            weight.add_(0.02 * weight.std().nan_to_num(0.0) * torch.randn_like(weight))
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def _pair_args(pair: Path) -> list[str]:
    return ["-m", str(pair / "target"), "--assistant-model", str(pair / "draft")]


# 1. Threads ---------------------------------------------------------------------------------------------


def test_threads_flag_sets_torch_threads_and_rounds_are_reported_apart(pair, tmp_path):
    """One run checks items 1 and 4: --threads reaches torch; speculative and plain rounds are counted apart."""
    out = tmp_path / "out.json"
    argv = [*_pair_args(pair), "--threads", "1", "--max-new-tokens", "10", "--num-assistant-tokens", "3"]
    run = _cli(*argv, "--json", str(out), OMP_NUM_THREADS="")
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    runtime, stats = data["runtime"], data["stats"]
    assert runtime["torch_threads"] == "1" and runtime["threads"] == "1" and runtime["threads_from"] == "--threads"
    assert stats["speculative_rounds"] + stats["plain_rounds"] == stats["rounds"] and stats["speculative_rounds"] > 0
    assert "(accepted / drafted)" in run.stderr and "plain rounds:" in run.stderr


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")
def test_default_threads_share_the_cores_among_local_ranks(pair, tmp_path):
    """Without OMP_NUM_THREADS torch would take every core; two ranks on this host get half each."""
    out = tmp_path / "out.json"
    argv = [*_pair_args(pair), "--max-new-tokens", "4", "--json", str(out)]
    run = _cli(*argv, OMP_NUM_THREADS="", LOCAL_WORLD_SIZE="2")
    assert run.returncode == 0, run.stderr
    runtime = json.loads(out.read_text())["runtime"]
    assert runtime["torch_threads"] == str(len(CPUS) // 2) and "local ranks 2" in runtime["threads_reason"]


def test_usable_cores_follow_the_cgroup_quota_and_ranks(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # a container given --cpus 1
    assert affinity.cgroup_cpu_quota(str(tmp_path)) == 1.0
    assert affinity.usable_cores(str(tmp_path), {}) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert affinity.cgroup_cpu_quota(str(tmp_path)) is None
    assert affinity.usable_cores(str(tmp_path), {"LOCAL_WORLD_SIZE": str(len(CPUS) or 1)}) == 1


def test_busy_machine_is_reported():
    assert "looks busy (load average 5.0 on 2 CPU(s))" in affinity.busy_note(load=5.0, cpus=2)
    assert affinity.busy_note(load=0.5, cpus=2) is None


def test_api_sets_threads():
    code = "import assisted_backends, torch; assisted_backends.set_threads(1); print(torch.get_num_threads())"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(OMP_NUM_THREADS=""))
    assert run.returncode == 0 and run.stdout.strip() == "1", run.stderr


# 2. Benchmark spread -------------------------------------------------------------------------------------


def test_speedup_interval_and_settling_rules():
    assert median_interval([1.2, 0.9, 1.5]) == (0.9, 1.5)  # under 5 pairs: min-max
    low, high = median_interval([1.0 + i / 100 for i in range(20)])
    assert 1.0 < low < high < 1.19  # 20 pairs: order statistics inside min-max
    assert is_settled(1.1, 1.4) and is_settled(0.6, 0.9) and is_settled(0.97, 1.03)
    assert not is_settled(0.87, 2.22)  # the quick benchmark: spread wider than the effect


def test_unsettled_cases_repeat_until_the_time_limit():
    clock = iter(range(1000))
    speedups, settled = run_pairs(lambda i: (0.8, 1.3)[i % 2], 3, time_limit=10, clock=lambda: next(clock))
    assert not settled and len(speedups) > 3
    speedups, settled = run_pairs(lambda i: 1.5, 3, time_limit=10, clock=lambda: 0.0)
    assert settled and len(speedups) == 3


def test_benchmark_rows_carry_the_spread_of_their_pairs(pair, tmp_path):
    out = tmp_path / "bench.json"
    argv = [*_pair_args(pair), "--task", "benchmark", "--compare", "--prompt-lengths", "12", "--new-tokens", "6"]
    run = _cli(*argv, "--repeats", "2", "--time-limit", "0", "--json", str(out))
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(out.read_text())["rows"]
    low, high = row["speedup_interval"]
    assert row["pairs"] == 2 == len(row["pair_speedups"]) and low <= row["speedup"] <= high
    assert isinstance(row["settled"], bool)
    assert "Speedup Interval" in run.stdout and "Settled" in run.stdout and "Speedup Interval holds" in run.stderr


# 3 and 10. Default output: reproducible, fp32, and readable on the demo pair -----------------------------


def test_default_demo_run_is_reproducible_exact_and_readable(tmp_path):
    texts = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        run = _cli("--max-new-tokens", "48", "--json", str(out))
        assert run.returncode == 0, run.stderr
        data = json.loads(out.read_text())
        assert data["runtime"]["dtype"] == "fp32"  # the exact default
        texts.append(data["text"])
    assert texts[0] == texts[1]
    lines = texts[0].splitlines()
    empty = sum(1 for line in lines if line.strip() in ("", "#"))  # the old demo: 70 of 91 lines blank, most others '#'
    assert 2 * empty < len(lines), texts[0]
    assert "what you see" in run.stderr


# 4. Statistics --------------------------------------------------------------------------------------------


def test_speculative_and_plain_rounds_are_reported_separately():
    stats = GenerationStats()
    for _ in range(3):
        stats.record_round(0, 0)
    stats.record_round(4, 4)
    assert (stats.speculative_rounds, stats.plain_rounds) == (1, 3)
    assert stats.acceptance_rate == 1.0 and stats.tokens_per_speculative_round == 5.0
    assert stats.mean_accepted_length == 2.0  # over every round, as before
    text = describe_stats(stats)
    assert "speculative rounds: 1" in text and "5.00 tokens per speculative round" in text and "plain rounds: 3" in text


# 5. Errors before work ------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["missing_dir", "directory", "read_only_dir"])
def test_unwritable_outputs_fail_before_any_model_loads(tmp_path, where):
    if where == "read_only_dir" and os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    path = {"missing_dir": tmp_path / "no" / "x.json", "directory": tmp_path}.get(where)
    if path is None:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        path = locked / "x.json"
    # -m points nowhere: an error about the output proves it was checked before loading
    _one_line_error(_cli("-m", str(tmp_path / "nowhere"), "--json", str(path)), "--json")
    _one_line_error(_cli("--task", "benchmark", "--csv", str(path)), "--csv")


def test_missing_prompt_file_and_plot_fail_before_work(tmp_path):
    run = _cli("--task", "benchmark", "--prompt-file", str(tmp_path / "missing.txt"))
    _one_line_error(run, "--prompt-file", "No such file")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        run = _cli(
            "-m", str(tmp_path / "nowhere"), "--task", "benchmark", "--compare", "--plot", str(tmp_path / "a.png")
        )
        _one_line_error(run, "--plot needs matplotlib", 'pip install -e ".[plot]"')


# 6. Ctrl-C ------------------------------------------------------------------------------------------------


def test_ctrl_c_stops_cleanly_and_keeps_finished_rows(pair, tmp_path):
    out = tmp_path / "rows.json"
    many = [str(n) for n in range(4, 204)]  # 8 + 203 tokens fit the tiny target's 256 positions
    argv = [*_pair_args(pair), "--task", "benchmark", "--prompt-lengths", "8", "--new-tokens", *many]
    process = subprocess.Popen(
        [_script(), *argv, "--repeats", "1", "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=interruptible,
    )
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("case 2/") and " done:" in line:
            break
    process.send_signal(signal.SIGINT)
    stdout, rest = process.communicate(timeout=120)
    stderr = "".join(seen) + rest
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "interrupted (Ctrl-C)"
    rows = json.loads(out.read_text())["rows"]
    assert 2 <= len(rows) < 200 and "New Tokens Generated" in stdout


# 7. Offline-first default draft ---------------------------------------------------------------------------


def test_missing_default_draft_is_reported_at_once_without_network(pair, tmp_path):
    """No HF_HUB_OFFLINE: the Hub endpoint is a local socket that counts connections; none may arrive."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        run = _cli("-m", str(claiming_7b(pair / "target")), HF_HUB_OFFLINE="", HF_ENDPOINT=endpoint,
                   HF_HOME=str(tmp_path / "hf"))  # fmt: skip
        try:
            server.accept()
            connected = True
        except BlockingIOError:
            connected = False
    finally:
        server.close()
    _one_line_error(run, "is not on this machine", "--prompt-lookup", "--assistant-early-exit", "hf download")
    assert not connected, "the default draft must not be downloaded implicitly"


# 8. Startup -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["--help"], ["--max-new-tokens", "x"], ["--compare"], ["-m", "/nonexistent/model", "--no-assisted"]]
)
def test_help_and_flag_errors_answer_before_importing_torch(argv):
    run = _cli(*argv, PYTHONPROFILEIMPORTTIME="1")
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert imported and "torch" not in imported and "transformers" not in imported
    assert run.returncode == (0 if argv == ["--help"] else 2)


# 9. Messages ----------------------------------------------------------------------------------------------


def test_messages_name_the_flags_the_user_typed(tmp_path):
    run = _cli("--max-new-tokens", "x")
    assert "expected a positive integer, got 'x'" in run.stderr and "_positive_int" not in run.stderr
    _one_line_error(_cli("--do_sample", "--top-p", "1.5"), "--top-p must be in (0, 1]")
    _one_line_error(_cli("-m", str(ROOT / "README.md")), "is a file, not a model")
    binary = tmp_path / "prompt.bin"
    binary.write_bytes(b"\xff\xfe\x00binary")
    _one_line_error(_cli("--prompt-file", str(binary)), "--prompt-file", "not UTF-8 text")
    error = OptionError("{name} is not supported; pass {fix}", name=("dtype", "bf16"), fix=("dtype", "fp32"))
    assert str(error) == "dtype='bf16' is not supported; pass dtype='fp32'"  # as generate(...) takes it
    assert error.render(cli_spelling) == "--dtype bf16 is not supported; pass --dtype fp32"  # as the user typed it
    assert 'pip install -e ".[gaudi]"' in install_hint("gaudi")


def test_smoke_pair_says_what_it_is_and_retraining_time_agrees_with_the_readme():
    """(test_cli.py's console-script demo run checks the smoke pair's notice on a real run.)"""
    from assisted_backends.cli.session import SMOKE_NOTICE

    assert "SMOKE" in SMOKE_NOTICE and "standard library" not in SMOKE_NOTICE
    help_minutes = re.search(r"about (\d+)\s+minutes", " ".join(_cli("--help").stdout.split())).group(1)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"about {help_minutes} minutes on 2 idle cores" in readme


# 12. Test time --------------------------------------------------------------------------------------------


def test_default_suite_deselects_the_long_tests_and_a_lane_runs_them():
    readme = (ROOT / "README.md").read_text()
    command = readme.split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert '-m "not slow' in command  # "not slow" or "not slow and not distributed"
    assert "-m slow" in (ROOT / ".ci" / "lanes" / "long_tests.sh").read_text()
    long_tests = {  # the chi-square tests that took 27-45 s each on a busy 2-core machine
        "engine/test_lossless_sampling.py": "test_assisted_sampling_matches_plain_sampling",
        "drafters/test_any_draft_sampling.py": "test_sampling_with_another_vocabulary_matches_plain_sampling",
        "drafters/test_prompt_lookup.py": "test_sampling_with_prompt_lookup_matches_plain_sampling",
    }
    for file, name in long_tests.items():
        tree = ast.parse((ROOT / "tests" / file).read_text())
        (function,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
        assert "pytest.mark.slow" in [ast.unparse(d) for d in function.decorator_list], f"{file}::{name}"

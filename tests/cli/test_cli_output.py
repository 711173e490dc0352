"""What a run prints: the statistics (speculative and plain rounds apart), a one-line backend report unless
`-v` (the JSON keeps it all), no loading bars, the same readable fp32 text from two default runs, and on Ctrl-C
a clean stop (status 130, no traceback) that still prints the text generated so far, a batch's finished
prompts, or a benchmark's finished rows."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable

from cli_fixtures import ROOT, cli_command, cli_env, interruptible, pair_args, run_cli

from assisted_backends.cli.report import describe_stats
from assisted_backends.engine.stats import GenerationStats


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


def test_the_backend_report_is_one_line_unless_verbose(saved_pair, tmp_path):
    argv = ["-m", str(saved_pair / "target"), "--prompt-lookup", "4", "--max-new-tokens", "4", "--prompt", "def f(x):"]
    quiet = run_cli(*argv, "--json", str(tmp_path / "q.json"))
    assert quiet.returncode == 0, quiet.stderr
    lines = quiet.stderr.strip().splitlines()
    summary = [line for line in lines if line.startswith("cpu: target fp32")]
    assert len(summary) == 1 and "-v for the full report" in summary[0], quiet.stderr
    assert not any(line.startswith(("torch_threads:", "dtype_reason:")) for line in lines), quiet.stderr
    assert "Loading weights" not in quiet.stderr and "%|" not in quiet.stderr, quiet.stderr
    loud = run_cli(*argv, "-v")
    assert loud.returncode == 0 and "torch_threads: 1" in loud.stderr and "dtype_reason:" in loud.stderr
    runtime = json.loads((tmp_path / "q.json").read_text())["runtime"]
    assert runtime["threads_from"] == "OMP_NUM_THREADS" and "torch_threads" in runtime  # JSON keeps it all


def test_default_demo_run_is_reproducible_exact_and_readable(tmp_path):
    texts = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        run = run_cli("--max-new-tokens", "48", "--json", str(out))
        assert run.returncode == 0, run.stderr
        data = json.loads(out.read_text())
        assert data["runtime"]["dtype"] == "fp32"  # the exact default
        texts.append(data["text"])
    assert texts[0] == texts[1]
    lines = texts[0].splitlines()
    empty = sum(1 for line in lines if line.strip() in ("", "#"))  # the old demo: 70 of 91 lines blank, most others '#'
    assert 2 * empty < len(lines), texts[0]
    assert "what you see" in run.stderr


# Ctrl-C -----------------------------------------------------------------------------------------------------


def _interrupted(*argv: str, ready: Callable[[str], bool], wait_s: float = 0.0) -> tuple[int, str, str]:
    """Run the command, send SIGINT `wait_s` after a stderr line satisfies `ready` (or stderr ends), and return
    (exit status, stdout, the whole stderr)."""
    process = subprocess.Popen(cli_command(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=cli_env(PYTHONUNBUFFERED="1"), cwd=ROOT, preexec_fn=interruptible)  # fmt: skip
    seen = []
    for line in iter(process.stderr.readline, ""):
        seen.append(line)
        if ready(line):
            break
    time.sleep(wait_s)
    process.send_signal(signal.SIGINT)
    out, rest = process.communicate(timeout=120)
    return process.returncode, out, "".join(seen) + rest


def _generating(line: str) -> bool:
    return line.startswith("cpu:")  # the summary: generation starts now


def test_ctrl_c_prints_the_text_generated_so_far():
    # 3000 tokens: ~9 s at 3 ms/token, so a fast CPU is still generating when the signal arrives
    code, out, err = _interrupted("--max-new-tokens", "3000", "--threads", "1", ready=_generating, wait_s=1.5)
    assert code == 130, err
    assert "interrupted after " in err and "Traceback" not in err
    generated = int(err.split("interrupted after ")[1].split()[0])
    assert generated > 0 and out.strip(), (out, err)


def test_ctrl_c_in_a_batched_run_prints_the_finished_prompts():
    argv = ["--max-new-tokens", "3000", "--threads", "1", "--batch-size", "2"]
    code, out, err = _interrupted(*argv, ready=_generating, wait_s=1.5)
    assert code == 130, err
    assert "Traceback" not in err
    finished = int(err.split("interrupted: ")[1].split()[0])
    assert out.count("--- prompt ") == finished  # each finished prompt printed under its number


def test_ctrl_c_stops_a_benchmark_cleanly_and_keeps_finished_rows(saved_pair, tmp_path):
    out = tmp_path / "rows.json"
    many = [str(n) for n in range(4, 204)]  # 8 + 203 tokens fit the tiny target's 256 positions
    argv = [*pair_args(saved_pair), "--task", "benchmark", "--prompt-lengths", "8", "--new-tokens", *many]
    code, stdout, stderr = _interrupted(*argv, "--repeats", "1", "--json", str(out),
                                        ready=lambda line: line.startswith("case 2/") and " done:" in line)  # fmt: skip
    assert code == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "interrupted (Ctrl-C)"
    rows = json.loads(out.read_text())["rows"]
    assert 2 <= len(rows) < 200 and "New Tokens Generated" in stdout

"""Pinned runs: the process reports the threads and CPUs it actually got, and warns when it is
oversubscribed. The runs go through `taskset` (util-linux, everywhere) and, where installed,
`numactl` (Debian's numactl package; .ci/lanes/numactl.sh installs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from tiny_models import tiny_model

from assisted_backends.backends.cpu import affinity

NUMACTL_LANE = os.environ.get("ASSISTED_BACKENDS_NUMACTL_LANE") == "1"  # .ci/lanes/numactl.sh: never skip
CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_taskset = pytest.mark.skipif(not CPUS or shutil.which("taskset") is None, reason="needs Linux taskset")


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    return env


def _report(launcher: list[str], **extra: str) -> tuple[dict, str]:
    run = subprocess.run(
        [*launcher, sys.executable, "-m", "assisted_backends.backends.cpu.affinity"],
        capture_output=True,
        text=True,
        env=_env(**extra),
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), run.stderr


def test_compact_cpu_lists():
    assert affinity._compact((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    assert affinity._compact((3,)) == "3" and affinity._compact(()) == ""


def test_placement_in_process(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    current = affinity.placement()
    assert current.torch_threads == torch.get_num_threads()
    assert current.preloaded_allocator == "jemalloc"
    assert set(current.as_dict()) >= {"torch_threads", "cpu_affinity", "numa_memory_nodes", "omp_num_threads"}


def test_oversubscription_warns_and_never_fails():
    crowded = affinity.ThreadPlacement(8, 1, (0, 1), "0", "8", None)
    with pytest.warns(affinity.ThreadOversubscriptionWarning, match="8 threads but this process is pinned to 2"):
        affinity.warn_if_oversubscribed(crowded)
    assert "OMP_NUM_THREADS=2" in crowded.as_dict()["thread_warning"]
    assert "thread_warning" not in affinity.ThreadPlacement(2, 1, (0, 1), "0", None, None).as_dict()


@needs_taskset
def test_taskset_pinned_run_reports_its_cpu():
    cpu = CPUS[-1]
    report, stderr = _report(["taskset", "-c", str(cpu)])
    assert report["cpu_affinity"] == str(cpu) and report["cpu_count_pinned"] == "1"
    assert report["torch_threads"] == "1"  # torch sizes its pool to the CPUs it may use
    assert "thread_warning" not in report and "ThreadOversubscriptionWarning" not in stderr


@needs_taskset
@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs (torch caps its pool at the machine's cores)")
def test_taskset_with_too_many_threads_warns():
    report, stderr = _report(["taskset", "-c", str(CPUS[0])], OMP_NUM_THREADS="2")
    assert report["torch_threads"] == "2" and report["omp_num_threads"] == "2"
    assert "pinned to 1 CPU(s)" in report["thread_warning"]
    assert "ThreadOversubscriptionWarning" in stderr


def _require(tool: str) -> None:
    if shutil.which(tool) is None:
        if NUMACTL_LANE:
            pytest.fail(f"{tool} is missing in the numactl lane")
        pytest.skip(f"{tool} is not installed (apt-get install numactl)")


def test_numactl_pinned_run_reports_cpu_and_memory_node():
    _require("numactl")
    node = "0"
    report, _ = _report(["numactl", "-C", str(CPUS[0]), "-m", node], OMP_NUM_THREADS="1")
    assert report["cpu_affinity"] == str(CPUS[0]) and report["numa_memory_nodes"] == node
    assert report["omp_num_threads"] == "1" and "thread_warning" not in report


@needs_taskset
def test_torch_xeon_launcher_pins_and_sets_threads():
    """`python -m torch.backends.xeon.run_cpu` (numactl where present, else taskset) on a .py program."""
    cpu = str(CPUS[-1])
    script = os.path.join(os.path.dirname(affinity.__file__), "affinity.py")
    launcher = [sys.executable, "-m", "torch.backends.xeon.run_cpu", "--core-list", cpu, "--ncores-per-instance", "1"]
    run = subprocess.run(
        [*launcher, "--disable-iomp", "--use-default-allocator", script],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["cpu_affinity"] == cpu and report["omp_num_threads"] == "1" and report["torch_threads"] == "1"


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    """A tiny Llama target and draft saved with a locally trained tokenizer (no downloads)."""
    from assisted_backends.demo.corpus import read_corpus
    from assisted_backends.demo.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("pinned_models")
    tokenizer = train_tokenizer(read_corpus(50_000)[0], 300)
    for name, seed, hidden in (("target", 0, 64), ("draft", 1, 32)):
        tiny_model("llama", seed=seed, vocab=len(tokenizer), hidden=hidden, init=0.1).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


@needs_taskset
@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs (torch caps its pool at the machine's cores)")
@pytest.mark.parametrize("launcher", ["taskset", "numactl"])
def test_cli_under_a_pinning_launcher_reports_the_affinity(saved_pair, tmp_path, launcher):
    _require(launcher)
    cpu = str(CPUS[-1])
    pin = ["taskset", "-c", cpu] if launcher == "taskset" else ["numactl", "-C", cpu, "-m", "0"]
    out = tmp_path / "out.json"
    command = [
        *pin,
        sys.executable,
        "-m",
        "assisted_backends.cli",
        "--device",
        "cpu",
        "-m",
        str(saved_pair / "target"),
        "--assistant-model",
        str(saved_pair / "draft"),
        "--draft-precision",
        "w8af32",
        "--max-new-tokens",
        "6",
        "--prompt",
        "def add(a, b):",
        "--json",
        str(out),
        "-v",  # the full report on stderr (default: one summary line)
    ]
    run = subprocess.run(command, capture_output=True, text=True, env=_env(OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1"))
    assert run.returncode == 0, run.stderr
    runtime = json.loads(out.read_text())["runtime"]
    assert runtime["cpu_affinity"] == cpu and runtime["torch_threads"] == "2"
    assert "pinned to 1 CPU(s)" in runtime["thread_warning"]  # 2 threads on 1 core: warned, not failed
    assert runtime["draft_precision"].startswith("w8af32")
    assert f"cpu_affinity: {cpu}" in run.stderr  # the CLI prints what it reports


def test_numactl_pinned_batch_run_of_the_command(tmp_path):
    """The command under numactl with a batch: two prompts in one call, each with its own completion."""
    _require("numactl")
    out = tmp_path / "batch.json"
    run = subprocess.run(
        ["numactl", "-C", str(CPUS[0]), "-m", "0", sys.executable, "-m", "assisted_backends.cli", "--batch-size",
         "2", "--max-new-tokens", "8", "--prompt", "def main():", "--no-stream", "--json", str(out)],
        capture_output=True, text=True, env=_env(OMP_NUM_THREADS="1"), timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    first, second = record["generated_token_ids"]  # the same prompt twice: the same tokens, at most 8
    assert first == second and 0 < len(first) <= 8 and record["stats"]["batch_size"] == 2


def test_numactl_pinned_queue_of_the_command(tmp_path):
    """The command under numactl with more prompts than slots (`api.queue`): the third prompt takes the slot of
    the first row that ends, and every prompt gets the tokens it gets alone."""
    _require("numactl")
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("def main():\nclass Stack:\nimport os\n")

    def pinned(*flags: str) -> dict:
        out = tmp_path / "out.json"
        run = subprocess.run(
            ["numactl", "-C", str(CPUS[0]), "-m", "0", sys.executable, "-m", "assisted_backends.cli",
             "--max-new-tokens", "8", "--no-stream", "--json", str(out), *flags],
            capture_output=True, text=True, env=_env(OMP_NUM_THREADS="1"), timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        return json.loads(out.read_text())

    queue = pinned("--batch-size", "2", "--prompt-file", str(prompt_file))
    assert queue["stats"]["batch_size"] == 2 and queue["stats"]["joins"] == 1
    assert queue["generated_token_ids"][2] == pinned("--prompt", "import os")["generated_token_ids"]

"""Helpers for the command line's tests: running the command (in this process or as a subprocess of this
checkout), reading what it printed, and model directories for the checks that read files only (no weights
are loaded).

Subprocesses run the CLI of this checkout (`python -m assisted_backends.cli` with this tree first on
PYTHONPATH), not whatever `run-assisted-generation` an editable install elsewhere points to.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
HAS_GGUF = importlib.util.find_spec("gguf") is not None  # the `gguf` extra (the IPEX lane's pinned stack has none)

SEVEN_B_LLAMA = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False)  # fmt: skip


def claiming_7b(source: Path) -> Path:
    """A copy of the saved Llama directory `source` whose config.json states a 7B Llama's sizes: larger than its
    family's default draft, so the CLI's file checks reach the question whether that draft is on this machine."""
    target = source.parent / f"{source.name}-claims-7b"
    if not target.is_dir():
        shutil.copytree(source, target)
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, **SEVEN_B_LLAMA}, indent=2))
    return target


def interruptible() -> None:
    """`preexec_fn` for a child that a test interrupts: SIGINT back to its default, so that the child's Python
    raises KeyboardInterrupt even where the test runs in a shell's background job (which ignores SIGINT, and
    its children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pair_args(root: Path) -> list[str]:
    """The flags naming the saved target and draft under `root` (the `saved_pair` fixture)."""
    return ["-m", str(root / "target"), "--assistant-model", str(root / "draft")]


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """The command in this process: (exit status, stdout, stderr)."""
    from assisted_backends.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def console_script(name: str = "run-assisted-generation") -> str:
    """The entry point installed with this interpreter (a venv's bin/ need not be on PATH)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    assert found, f"console script {name!r} is not installed: pip install -e ."
    return found


def cli_env(**extra: str) -> dict[str, str]:
    """This environment for a subprocess: offline, one OpenMP thread, no thread or rank settings of the caller's,
    this checkout first on PYTHONPATH; `extra` adds variables, and an empty value removes one."""
    dropped = ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra})
    return {k: v for k, v in env.items() if v != ""}


def cli_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "assisted_backends.cli", *argv]


def run_cli(*argv: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """The command as a subprocess of this checkout, in `cli_env(**env)`."""
    return subprocess.run(cli_command(*argv), capture_output=True, text=True, env=cli_env(**env), timeout=timeout,
                          cwd=ROOT)  # fmt: skip


def imported_modules(run: subprocess.CompletedProcess) -> set[str]:
    """The modules a run with PYTHONPROFILEIMPORTTIME=1 imported."""
    return {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}


def messages(run: subprocess.CompletedProcess) -> list[str]:
    """The run's stderr lines, without PYTHONPROFILEIMPORTTIME's."""
    return [line for line in run.stderr.splitlines() if not line.startswith("import time:")]


def assert_one_line_error(run: subprocess.CompletedProcess, *needles: str) -> None:
    """The run failed with status 2 before loading weights, without a traceback, its last line holding `needles`."""
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "Loading weights" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, last

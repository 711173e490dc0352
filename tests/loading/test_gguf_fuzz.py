"""A seeded GGUF fuzzer (issue 49): mutated tiny Llama files (tests/gguf_fuzz.py: headers, metadata types and
values, tensor tables, dimensions, offsets, truncation, data bytes), each opened by `AssistedGenerator(path)` (and
its tokenizer read as the command line reads it) in a worker process (tests/gguf_fuzz_worker.py) that is restarted
after a case that kills it (a signal, AddressSanitizer's exit, a hang past the time limit); a few cases also
through the command line (`python -m assisted_backends.cli -m FILE --prompt-lookup 10`, ~5 s each).

The contract for every case: the file loads and generates, and greedy prompt-lookup decoding gives exactly plain
greedy decoding's tokens on the same loaded model; or it stops with one line (a ValueError / RuntimeError whose
str is one non-empty line; through the command line exit status 2 and one `error:` line). Never a signal, a hang,
another exception type or a multi-line message; and a file that is certainly invalid (`Case.must_fail`: a shape
that disagrees with the config, data overlapping or past the end, a bad magic, version, count or type) never
produces tokens. Each failure names its seed; `python tests/gguf_fuzz.py SEED out.gguf` writes that case's file.

The default suite runs DEFAULT_CASES seeds (every mutation family on every base file; the whole module: 62 s on 2
shared cores at a load of 3, 2026-12-07), `-m slow` (the long-tests lane) SLOW_CASES more (~95 s);
.ci/lanes/asan.sh runs the default ones with the kernels and the native decoder built under AddressSanitizer.
ASSISTED_BACKENDS_FUZZ_CASES=N runs N seeds instead of DEFAULT_CASES.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the GGUF fuzzer needs the gguf package: pip install gguf")

from gguf_fuzz import BASES, MUTATIONS, Case, case, write_base  # noqa: E402
from gguf_fuzz_worker import Answer, Worker, linked_cache, scratch_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CASES = int(os.environ.get("ASSISTED_BACKENDS_FUZZ_CASES", "390"))  # 6 rounds: 13 families x 5 files
SLOW_CASES = range(100_000, 105_000)
CLI_FAMILIES = ("tensor_resize", "metadata_value", "metadata_type", "truncate", "data_bytes")
CLI_SEED_FROM = 50_000


@pytest.fixture(scope="module")
def folder():
    made = scratch_folder()
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="module")
def bases(folder) -> dict[str, Path]:
    return {name: write_base(name, folder / f"base-{name}.gguf") for name in BASES}


@pytest.fixture(scope="module")
def worker(folder, bases):
    running = Worker(bases["q4_0"], folder)
    yield running
    running.stop()


def problem(made: Case, answer: Answer) -> str | None:
    """Why `answer` breaks the contract for `made`, or None."""
    if answer.outcome in ("crashed", "hung"):
        return f"{answer.outcome}: {answer.message}\n{answer.tail}"
    if answer.outcome == "error":
        one_line = answer.message.strip() != "" and "\n" not in answer.message.strip()
        if answer.clean_type and one_line:
            return None
        return f"{answer.error_type}, not one line of a ValueError / RuntimeError:\n{answer.tail}"
    if made.must_fail:
        return f"tokens from an invalid file: {answer.plain}"
    if answer.plain != answer.assisted:
        return f"assisted decoding {answer.assisted} != plain {answer.plain}"
    return None


def run_seeds(worker: Worker, folder: Path, bases: dict[str, Path], seeds) -> tuple[list[str], dict[str, int]]:
    """(one report per case that breaks the contract, outcome counts)."""
    failures, counts = [], {}
    for seed in seeds:
        made = case(seed, folder, bases)
        answer = worker.ask(str(made), made.path)
        counts[answer.outcome] = counts.get(answer.outcome, 0) + 1
        found = problem(made, answer)
        if found:
            failures.append(f"{made}: {found}")
        made.path.unlink()
    return failures, counts


def _report(failures: list[str], counts: dict[str, int], seconds: float) -> str:
    head = f"{len(failures)} cases broke the contract ({counts}, {seconds:.0f} s)"
    head += "; write a case's file: python tests/gguf_fuzz.py SEED out.gguf"
    return "\n\n".join([head, *failures])


def test_the_base_files_load_and_decode_as_plain(worker, bases):
    """The control: every unmutated file loads, drafts, and gives plain greedy's tokens (else the fuzzer tests
    nothing)."""
    for name, path in bases.items():
        answer = worker.ask(f"base {name}", path)
        assert answer.outcome == "loaded", (name, answer)
        assert answer.plain == answer.assisted and len(answer.plain) > 0 and answer.drafted > 0, (name, answer)


def test_the_driver_reports_a_signal_and_a_hang_and_goes_on(worker, folder, bases):
    """The process boundary works: a worker killed by a signal, or silent past the time limit, is that case's
    failure (with its seed), and the next case runs in a fresh worker."""
    limit, starts = worker.timeout, worker.starts
    worker.timeout = 6.0
    try:
        crashed = worker.ask("self-test signal", Path("<signal>"))
        assert crashed.outcome == "crashed" and "SIGABRT" in crashed.message, crashed
        assert problem(case(0, folder, bases), crashed).startswith("crashed: killed by signal SIGABRT")
        hung = worker.ask("self-test hang", Path("<hang>"))
        assert hung.outcome == "hung" and "no answer in 6 s" in hung.message, hung
        after = worker.ask("base q4_0", bases["q4_0"])
        assert after.outcome == "loaded" and after.plain == after.assisted, after
        assert worker.starts == max(starts, 1) + 2, (starts, worker.starts)
    finally:
        worker.timeout = limit


def test_mutated_files_load_and_decode_as_plain_or_stop_in_one_line(worker, folder, bases):
    started = time.monotonic()
    failures, counts = run_seeds(worker, folder, bases, range(DEFAULT_CASES))
    print(f"gguf fuzz: {DEFAULT_CASES} cases, {counts}, {time.monotonic() - started:.1f} s, {worker.starts} worker(s)")
    assert not failures, _report(failures, counts, time.monotonic() - started)
    assert counts.get("loaded", 0) > 0 and counts.get("error", 0) > 0, counts  # both sides of the contract ran


@pytest.mark.slow
def test_more_mutated_files(worker, folder, bases):
    started = time.monotonic()
    failures, counts = run_seeds(worker, folder, bases, SLOW_CASES)
    assert not failures, _report(failures, counts, time.monotonic() - started)


def _cli_seeds() -> list[int]:
    """The first seed from CLI_SEED_FROM of each family in CLI_FAMILIES."""
    families = list(MUTATIONS)
    return [next(s for s in range(CLI_SEED_FROM, CLI_SEED_FROM + 1000) if families[s % len(families)] == f)
            for f in CLI_FAMILIES]  # fmt: skip


@pytest.mark.parametrize("seed", _cli_seeds())
def test_the_command_line_generates_or_stops_with_one_error_line(seed, folder, bases, tmp_path):
    made = case(seed, tmp_path, bases)
    out = tmp_path / "out.json"
    env = {**os.environ, "ASSISTED_BACKENDS_CACHE": str(linked_cache(tmp_path)), "HF_HUB_OFFLINE": "1"}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    command = [sys.executable, "-m", "assisted_backends.cli", "-m", str(made.path), "--prompt", "ab ab ab ab ab",
               "--max-new-tokens", "8", "--prompt-lookup", "10", "--json", str(out)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{made}: the command line did not end in 300 s")
    lines = done.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    if done.returncode == 0:
        assert not made.must_fail, f"{made}: tokens from an invalid file: {json.loads(out.read_text())}"
        assert json.loads(out.read_text())["generated_token_ids"], made
        return
    assert done.returncode == 2, f"{made}: exit status {done.returncode}\n{done.stderr[-3000:]}"
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in done.stderr, f"{made}:\n{done.stderr}"

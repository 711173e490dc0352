"""The Python API picks its CPU thread count as the command line does: one measured probe per process, cached;
`set_threads(n)` and `threads=n` override it, and a count above the usable cores is lowered with one warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from tiny_models import tiny_model

import assisted_backends
from assisted_backends.api import threads
from assisted_backends.backends.cpu import affinity

CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)


@pytest.fixture
def fresh_choice():
    """Each test starts with no decision made, and leaves the suite's thread count as it found it."""
    before, chosen = torch.get_num_threads(), threads.current()
    threads.forget()
    yield
    threads.adopt(chosen) if chosen is not None else threads.forget()
    torch.set_num_threads(before)


def test_set_threads_fixes_the_count_and_no_probe_runs(fresh_choice):
    model = tiny_model("llama", 0)
    assert assisted_backends.set_threads(1) == 1
    assisted_backends.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3)
    assert threads.current().source == "set_threads" and torch.get_num_threads() == 1


def test_the_argument_wins_for_its_call_and_the_process_choice_comes_back(fresh_choice):
    model = tiny_model("llama", 0)
    threads.set_threads(1)
    assisted_backends.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3, threads=1)
    assert torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="threads must be >= 1"):
        assisted_backends.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3, threads=0)


def test_more_threads_than_cores_are_lowered_with_one_warning(fresh_choice, capsys):
    cores = affinity.usable_cores()
    assert threads.set_threads(cores + 997) == cores
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and f"using {cores}" in err


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")
def test_the_first_call_probes_once_and_the_answer_is_cached(fresh_choice):
    model = tiny_model("llama", 0)
    assisted_backends.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3)
    first = threads.current()
    assert first.source == "probe" and "ms at 1 thread" in first.reason
    assisted_backends.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3)
    assert threads.current() is first and torch.get_num_threads() == first.threads


def test_a_count_the_caller_set_with_torch_is_kept(fresh_choice):
    model = tiny_model("llama", 0)
    threads.set_threads(affinity.usable_cores())
    torch.set_num_threads(1)
    assisted_backends.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3)
    assert threads.current().source == "torch.set_num_threads" and torch.get_num_threads() == 1


API_UNDER_A_BUSY_NEIGHBOUR = """
import json, statistics, time, torch
import assisted_backends
from assisted_backends.api import threads
from assisted_backends.demo.pair import shipped_pair
from transformers import AutoModelForCausalLM, AutoTokenizer

pair = shipped_pair()
tokenizer = AutoTokenizer.from_pretrained(pair.target_dir)
target = AutoModelForCausalLM.from_pretrained(pair.target_dir).float()
draft = AutoModelForCausalLM.from_pretrained(pair.draft_dir).float()
ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids

def call(**extra):
    began = time.perf_counter()
    assisted_backends.generate(target, ids, assistant_model=draft, max_new_tokens=32, repetition_penalty=1.2,
                               schedule="constant", **extra)
    return time.perf_counter() - began

call()  # the first call probes
seconds = {"default": [], 1: [], 2: []}
for round_index in range(3):
    for key in ("default", 1, 2) if round_index % 2 == 0 else (2, 1, "default"):
        seconds[key].append(call() if key == "default" else call(threads=key))
print(json.dumps({"chosen": threads.current().threads, "reason": threads.current().reason,
                  "s": {str(k): statistics.median(v) for k, v in seconds.items()}}))
"""


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")
def test_api_default_under_a_busy_neighbour_is_near_the_best_thread_count():
    """The issue's case: a process spins on one of two cores; `generate` with no thread setting (torch's default
    would be every core) must run within 1.3x of the faster of 1 and 2 threads, measured afterwards."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    try:
        time.sleep(0.3)
        run = subprocess.run([sys.executable, "-c", API_UNDER_A_BUSY_NEIGHBOUR], capture_output=True, text=True,
                             env=env, timeout=300)  # fmt: skip
    finally:
        spinner.kill()
        spinner.wait()
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["s"]["default"] <= 1.3 * min(result["s"]["1"], result["s"]["2"]), result

"""Batch size 1 against an earlier version of the package: is one prompt as fast as before a change?

    python -m benchmarks.versions_b1 --baseline 33e0c78 --rounds 4

Checks out `--baseline` into a temporary git worktree and times, on the embedded demo pair (1 thread,
64-token prompt, 96 new tokens, greedy fp32), plain decoding, a draft model at γ = 4 and prompt lookup
in each version, alternating the two versions round by round in fresh processes (so machine load
drifts hit both), 3 calls per version and round. Prints and writes the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

from benchmarks.harness import RESULTS, command_line, interleaved, write_result

REPO = Path(__file__).resolve().parents[1]
CASES = ("plain", "draft_model_gamma4", "prompt_lookup4")

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM, AutoTokenizer
from assisted_backends import generate
from assisted_backends.demo.pair import shipped_pair
pair = shipped_pair()
target = AutoModelForCausalLM.from_pretrained(pair.target_dir).eval()
draft = AutoModelForCausalLM.from_pretrained(pair.draft_dir).eval()
tokenizer = AutoTokenizer.from_pretrained(pair.target_dir)
ids = tokenizer(pair.held_out_text.read_text()[:400], return_tensors="pt").input_ids[:, :64]
cases = {"plain": {}, "draft_model_gamma4": dict(assistant_model=draft, num_assistant_tokens=4),
         "prompt_lookup4": dict(prompt_lookup_num_tokens=4)}
result = {}
for name, kwargs in cases.items():
    generate(target, ids, max_new_tokens=16, **kwargs)  # warm-up
    rates = []
    for _ in range(int(sys.argv[1])):
        began = time.perf_counter()
        generate(target, ids, max_new_tokens=96, **kwargs)
        rates.append(96 / (time.perf_counter() - began))
    result[name] = rates
print(json.dumps(result))
"""


def run_version(source: Path, calls: int) -> dict[str, list[float]]:
    """{case: tokens/s of each timed call} from a fresh process importing the package at `source`."""
    environment = dict(os.environ, PYTHONPATH=str(source), OMP_NUM_THREADS="1")
    output = subprocess.run(
        [sys.executable, "-c", CHILD, str(calls)], env=environment, capture_output=True, text=True, check=True
    )
    return json.loads(output.stdout.strip().splitlines()[-1])


def _concatenated(rounds: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """{case: every round's values, in order}."""
    merged: dict[str, list[float]] = {}
    for values_by_case in rounds:
        for case, values in values_by_case.items():
            merged.setdefault(case, []).extend(values)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", required=True, help="git revision to compare with (e.g. the commit before a change)"
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=3, help="timed generate calls per case, version and round")
    parser.add_argument("--json", type=Path, default=RESULTS / "versions_b1.json")
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        baseline_dir = Path(scratch) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(baseline_dir), args.baseline], cwd=REPO, check=True
        )
        try:
            sources = {"baseline": baseline_dir, "current": REPO}
            cases = {version: partial(run_version, source, args.calls) for version, source in sources.items()}
            outputs = interleaved(cases, args.rounds, warmup=0).outputs  # the versions alternate round by round
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline_dir)], cwd=REPO, check=False)
    rates = {version: _concatenated(rounds) for version, rounds in outputs.items()}
    summary = {}
    for case in CASES:
        before, after = statistics.median(rates["baseline"][case]), statistics.median(rates["current"][case])
        summary[case] = {
            "baseline_tokens_per_s": before,
            "current_tokens_per_s": after,
            "current_over_baseline": after / before,
        }
        print(f"{case:20s} baseline {before:7.1f} tok/s  current {after:7.1f} tok/s  ratio {after / before:.3f}")
    payload = {"baseline": args.baseline, "current": head, "summary": summary, "rates": rates}
    write_result("versions_b1", command_line("versions_b1"), payload, args.json)


if __name__ == "__main__":
    main()

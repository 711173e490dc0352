"""benchmarks/queue.py on tiny models: every method runs, counts each prompt's tokens the same way (all equal
the plain queue's in fp32, transformers' batched `model.generate` included), and the ratios are computed in
one run. Keeps the benchmark from rotting between the full runs (python -m benchmarks.queue)."""

from __future__ import annotations

import pytest
from test_batches import pair, prompts

from benchmarks.queue import METHODS, QueueCase, median_summary, ratios, run_method

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_method_of_the_queue_benchmark_runs_and_agrees():
    target, draft = pair("llama")
    rows = [row.tolist() for row in prompts((6, 14, 3, 9, 20), seed=3)]
    eos = 77
    case = QueueCase(
        target, rows, dict(max_new_tokens=10, eos_token_id=[eos]), dict(assistant_model=draft, num_assistant_tokens=3),
        dict(assistant_model=draft), pad_id=0, eos=[eos],
    )  # fmt: skip
    runs = {method: [run_method(method, case, 2, rows)] for method in METHODS}
    reference = runs["plain"][0]["tokens"]
    assert len(reference) == len(rows) and any(len(t) < 10 for t in reference), "some answers end at EOS"
    summary = {method: median_summary(values, reference) for method, values in runs.items()}
    assert all(values["same_as_plain"] == 1.0 for values in summary.values()), {
        m: v["same_as_plain"] for m, v in summary.items()
    }
    assert all(values["new_tokens"] == sum(map(len, reference)) for values in summary.values())
    assert summary["plain"]["target_passes"] < summary["fixed_plain"]["target_passes"], "refilled slots never idle"
    shown = ratios(summary)
    assert set(shown) >= {"adaptive_vs_plain", "constant_vs_plain", "refill_vs_fixed_plain", "plain_vs_transformers"}
    assert all(value > 0 for value in shown.values())

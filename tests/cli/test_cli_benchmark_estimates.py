"""The benchmark says how long it will take: a total before the first case (a full run also
names `--quick`), each case an estimate before it starts and again from its first pair. The cost model's
arithmetic is checked exactly on given timings; on a real run the estimates must land within 3x of what the
case then takes (a shared machine's load moves a case's own time by up to 2x between its pairs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from assisted_backends.cli.estimate import CostModel
from assisted_backends.cli.main import main

SECONDS = r"([\d.]+) (s|min)"


def _seconds(number: str, unit: str) -> float:
    return float(number) * (60 if unit == "min" else 1)


SPREAD = 3.0  # how far a real run's time may land from its estimate


def test_the_cost_model_is_linear_in_prompt_and_new_tokens_at_the_latest_rates():
    model = CostModel()
    model.record("plain", 32, 48, total_s=1.0, prefill_s=0.04)  # 1.25 ms a prompt token, 20 ms a new token
    model.record("assisted", 32, 48, total_s=0.6, prefill_s=0.04)
    assert model.run_s("plain", 128, 96) == pytest.approx(128 * 0.04 / 32 + 96 * 0.96 / 48, rel=1e-12)
    assert model.pair_s(["plain", "assisted"], 128, 96) == model.run_s("plain", 128, 96) + model.run_s(
        "assisted", 128, 96
    )
    model.record("plain", 32, 48, total_s=2.0, prefill_s=0.08)  # the machine got busier: the latest rates count
    assert model.run_s("plain", 32, 48) == pytest.approx(2.0, rel=1e-12)
    model.record("hf", 64, 48, total_s=1.5, prefill_s=0.0)  # no prefill split: the package's plain prefill rate
    assert model.prefill["hf"] == model.prefill["plain"]


def test_each_case_estimate_is_near_its_time(capsys):
    code = main(["--task", "benchmark", "--prompt-lengths", "32", "128", "--new-tokens", "48", "96", "--repeats", "3",
                 "--threads", "1"])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    total = re.search(rf"benchmark: 4 cases, about {SECONDS} in all", err)
    assert total and "--quick" not in total.group(0)  # cases named: no preset to suggest
    took = {int(c): _seconds(n, u) for c, n, u in re.findall(rf"case (\d)/4 done: .* in {SECONDS}", err)}
    before = {
        int(c): _seconds(n, u) for c, n, u in re.findall(rf"case (\d)/4: \d+ \+ \d+ tokens, about {SECONDS}", err)
    }
    first = {int(c): _seconds(n, u) for c, n, u in re.findall(rf"case (\d)/4: first pair .*, about {SECONDS} for", err)}
    assert len(took) == len(first) == len(before) == 4, err
    for case in range(1, 5):
        assert took[case] / SPREAD <= first[case] <= took[case] * SPREAD, (case, first[case], took[case], err)
        if case > 1:  # the cost model fitted on the cases before it
            assert took[case] / SPREAD <= before[case] <= took[case] * SPREAD, (case, before[case], took[case], err)
    assert sum(took.values()) / SPREAD <= _seconds(*total.groups()) <= sum(took.values()) * SPREAD, err


def test_the_full_run_says_its_total_first_and_names_quick():
    run = subprocess.Popen([sys.executable, "-m", "assisted_backends.cli", "--task", "benchmark", "--compare"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        lines = []
        while not lines or not (lines[-1].startswith(("benchmark:", "case ")) or not lines[-1]):
            lines.append(run.stderr.readline())
    finally:
        run.kill()
        run.wait()
    announced = lines[-1]
    assert re.match(rf"benchmark: 10 cases, about {SECONDS} in all \(up to {SECONDS} if every case", announced), lines
    assert re.search(rf"--quick runs 2 short cases, about {SECONDS}", announced), announced

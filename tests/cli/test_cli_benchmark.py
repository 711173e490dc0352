"""The benchmark's cases, time and spread. It says how long it will take: a total before the first case (a
full run also names `--quick`), each case an estimate before it starts and again from its first pair; the cost
model's arithmetic is checked exactly on given timings, and on a real run the estimates must land within 3x of
what the case then takes (a shared machine's load moves a case's own time by up to 2x between its pairs). Each
row carries the spread of its speedup over repeated pairs (an interval; unsettled cases repeat until the time
limit) and the load its runs saw (a row whose load changed is not settled), and the plot draws both; batched
rows add the batch size, aggregate tokens/s, per-row latency and transformers' batched `model.generate`; the
default cases fit the demo target."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from argparse import Namespace

import pytest
from cli_fixtures import pair_args, run_cli, run_main

from assisted_backends.backends.cpu.affinity import CpuUse
from assisted_backends.cli import benchmark
from assisted_backends.cli.estimate import CostModel
from assisted_backends.cli.main import main
from assisted_backends.cli.spread import is_settled, median_interval, run_pairs

# How long it will take -------------------------------------------------------------------------------------

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


def test_benchmark_case_defaults_fit_the_demo_target():
    cases = benchmark.benchmark_cases(Namespace(prompt_lengths=None, new_tokens=None, quick=False))
    assert max(p + n for p, n in cases) <= 4096


# The spread of a row's speedup ------------------------------------------------------------------------------


def test_speedup_interval_and_settling_rules():
    assert median_interval([1.2, 0.9, 1.5]) == (0.9, 1.5)  # under 5 pairs: min-max
    low, high = median_interval([1.0 + i / 100 for i in range(20)])
    assert 1.0 < low < high < 1.19  # 20 pairs: order statistics inside min-max
    assert is_settled(1.1, 1.4) and is_settled(0.6, 0.9) and is_settled(0.97, 1.03)
    assert not is_settled(0.87, 2.22)  # a quick benchmark's spread wider than the effect


def test_unsettled_cases_repeat_until_the_time_limit():
    clock = iter(range(1000))
    speedups, settled = run_pairs(lambda i: (0.8, 1.3)[i % 2], 3, time_limit=10, clock=lambda: next(clock))
    assert not settled and len(speedups) > 3
    speedups, settled = run_pairs(lambda i: 1.5, 3, time_limit=10, clock=lambda: 0.0)
    assert settled and len(speedups) == 3


def test_benchmark_rows_carry_the_spread_of_their_pairs(saved_pair, tmp_path):
    out = tmp_path / "bench.json"
    argv = [*pair_args(saved_pair), "--task", "benchmark", "--compare", "--prompt-lengths", "12", "--new-tokens", "6"]
    run = run_cli(*argv, "--repeats", "2", "--time-limit", "0", "--json", str(out))
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(out.read_text())["rows"]
    low, high = row["speedup_interval"]
    assert row["pairs"] == 2 == len(row["pair_speedups"]) and low <= row["speedup"] <= high
    assert isinstance(row["settled"], bool)
    assert "Speedup Interval" in run.stdout and "Settled" in run.stdout and "Speedup Interval holds" in run.stderr


# Rows say the load they ran under ---------------------------------------------------------------------------


def _measurement(others: float, wall: float = 0.5) -> benchmark.Measurement:
    return benchmark.Measurement(wall, 0.0, wall, 8, None, None, cpu=CpuUse(wall, 1.0, others))


def test_load_state_tells_steady_from_changed_loads():
    assert benchmark.load_state([_measurement(0.0), _measurement(0.1), _measurement(0.3)])[2] is True
    assert benchmark.load_state([_measurement(0.0), _measurement(1.0)]) == (0.0, 1.0, False)
    assert benchmark.load_state([_measurement(0.0, wall=0.02), _measurement(1.0, wall=0.02)])[2] is True  # 10 ms ticks
    assert benchmark.load_state([benchmark.Measurement(1, 0, 1, 8, None, None)]) is None


class _LoadChangesHalfway:
    """A CpuMeter whose readings say a neighbour started using one CPU after `quiet` runs."""

    runs = 0
    quiet = 4

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        type(self).runs += 1
        self.use = CpuUse(0.5, 1.0, 0.0 if self.runs <= self.quiet else 1.0)


def test_a_row_whose_runs_saw_different_loads_is_not_settled(saved_pair, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "CpuMeter", _LoadChangesHalfway)
    monkeypatch.setattr(_LoadChangesHalfway, "runs", 0)
    out = tmp_path / "bench.json"
    argv = ["-m", str(saved_pair / "target"), "--prompt-lookup", "4", "--task", "benchmark", "--compare"]
    code = main([*argv, "--prompt-lengths", "12", "--new-tokens", "6", "--repeats", "3", "--time-limit", "0",
                 "--threads", "1", "--json", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    (row,) = json.loads(out.read_text())["rows"]
    assert row["load_steady"] is False and row["settled"] is False and row["others_cpus"] == [0.0, 1.0]
    assert row["settled_text"].startswith("NO: the load changed between runs (others used 0.0-1.0 CPUs)")
    assert "case 1/1: 12 + 6 tokens, about" in err and "case 1/1 done:" in err


def test_plot_draws_intervals_and_marks_unsettled_rows():
    pytest.importorskip("matplotlib")
    from matplotlib.container import ErrorbarContainer

    rows = [
        {"prompt_tokens": 128, "new_tokens": 64, "speedup": 1.2, "speedup_interval": [1.1, 1.3], "settled": True},
        {"prompt_tokens": 128, "new_tokens": 128, "speedup": 1.0, "speedup_interval": [0.9, 1.2], "settled": False},
    ]
    figure = benchmark.speedup_figure(rows)
    axis = figure.axes[0]
    (errorbars,) = [c for c in axis.containers if isinstance(c, ErrorbarContainer)]
    spans = sorted(tuple(round(v, 6) for v in segment[:, 1]) for segment in errorbars.lines[2][0].get_segments())
    assert spans == [(0.9, 1.2), (1.1, 1.3)]
    hatches = [patch.get_hatch() for patch in axis.patches]
    assert hatches == [None, "//"] and [t.get_text() for t in axis.texts] == ["unsettled"]


# Batches ----------------------------------------------------------------------------------------------------


def test_benchmark_batches_report_batch_aggregate_rate_and_transformers(saved_pair, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code, stdout, err = run_main(
        capsys, *pair_args(saved_pair), "--no-stream", "--task", "benchmark", "--compare", "--batch-size", "3",
        "--prompt-lengths", "12", "--new-tokens", "8", "--repeats", "1", "--time-limit", "0", "--json", str(out),
    )  # fmt: skip
    assert code == 0, err
    row = json.loads(out.read_text())["rows"][0]
    assert row["batch_size"] == 3 and row["new_tokens"] == 8
    assert row["tokens_per_s"] == pytest.approx(3 * 8 / row["total_s"])
    assert row["transformers_tokens_per_s"] > 0 and row["row_latency_s"] <= row["total_s"]
    assert row["speedup_vs_transformers"] == pytest.approx(row["tokens_per_s"] / row["transformers_tokens_per_s"])
    assert "transformers Tokens/Sec" in stdout and "Row Latency (s)" in stdout

"""The benchmark says how long it will take: a total before the first case (a full run also
names `--quick`), each case an estimate before it starts and again from its first pair, within 1.5x of what the
case then takes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from assisted_backends.cli.main import main

SECONDS = r"([\d.]+) (s|min)"


def _seconds(number: str, unit: str) -> float:
    return float(number) * (60 if unit == "min" else 1)


def test_each_case_estimate_is_within_1_5x_of_its_time(capsys):
    code = main(["--task", "benchmark", "--prompt-lengths", "32", "128", "--new-tokens", "48", "96", "--repeats", "3",
                 "--threads", "1"])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    total = re.search(rf"benchmark: 4 cases, about {SECONDS} in all", err)
    assert total and "--quick" not in total.group(0)  # cases named: no preset to suggest
    took = {int(c): _seconds(n, u) for c, n, u in re.findall(rf"case (\d)/4 done: .* in {SECONDS}", err)}
    before = {int(c): _seconds(n, u) for c, n, u in re.findall(rf"case (\d)/4: \d+ \+ \d+ tokens, about {SECONDS}", err)}
    first = {int(c): _seconds(n, u) for c, n, u in re.findall(rf"case (\d)/4: first pair .*, about {SECONDS} for", err)}
    assert len(took) == len(first) == len(before) == 4, err
    for case in range(1, 5):
        assert took[case] / 1.5 <= first[case] <= took[case] * 1.5, (case, first[case], took[case], err)
        if case > 1:  # the cost model fitted on the cases before it
            assert took[case] / 1.5 <= before[case] <= took[case] * 1.5, (case, before[case], took[case], err)
    assert sum(took.values()) / 1.5 <= _seconds(*total.groups()) <= sum(took.values()) * 1.5, err


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

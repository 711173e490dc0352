"""The learning-curve benchmark's extrapolation: a least-squares line E = a + b log2(positions) through the
curve's second half, where it reaches the aimed E, and the hours at the run's own training rate."""

from __future__ import annotations

import math

from benchmarks.eagle_learning_curve import extrapolate


def _result(points: list[tuple[int, float]], train_s: float) -> dict:
    return {"curve": [{"positions": p, "E": e} for p, e in points], "seconds": {"train": train_s}}


def test_a_log_linear_curve_is_extended_to_where_it_reaches_the_aimed_e():
    # E = 1 + 0.1 log2(p / 1000) exactly; the first half (p < 32000) is noise the fit must ignore
    points = [(1000, 3.0), (8000, 0.5)] + [(p, 1 + 0.1 * math.log2(p / 1000)) for p in (32000, 48000, 64000)]
    line = extrapolate(_result(points, train_s=64.0), target_e=1.8)
    assert line["E_per_doubling"] == 0.1
    assert line["positions_needed"] == 256000  # 1000 · 2^8
    assert line["training_positions_per_s"] == 1000.0  # 64000 positions in 64 s
    assert line["hours_needed"] == round(256000 / 1000 / 3600, 1)


def test_a_flat_curve_never_reaches_it_and_too_few_points_give_no_line():
    flat = extrapolate(_result([(p, 1.2) for p in (10, 20, 30, 40)], train_s=1.0), target_e=2.2)
    assert flat["positions_needed"] is None and flat["hours_needed"] is None
    assert extrapolate(_result([(0, 1.0), (40, 1.2), (50, 1.3)], train_s=1.0), target_e=2.2) is None

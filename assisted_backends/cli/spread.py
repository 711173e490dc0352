"""How far a benchmark's speedup can be trusted: an interval on the median of the interleaved pairs'
speedups, when it counts as settled, and the loop that adds pairs until it is (or a time limit passes).
Also the interleaving primitive itself: the order of one round of cases, and one timed round."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")
ROUND_ORDERS = ("fixed", "alternate", "rotate")  # same order every round | reversed every other round | rotated

INTERVAL_COVERAGE = 0.9  # of the order-statistic interval around the median pair speedup
NO_EFFECT_BAND = (0.95, 1.05)  # an interval inside it settles as "no difference"


def round_order(names: Sequence[str], repeat: int, order: str = "fixed") -> list[str]:
    """The order of round `repeat` of an interleaved run: `fixed` (as given), `alternate` (reversed on odd
    rounds), or `rotate` (shifted by one per round), so that drift in machine load hits every case alike."""
    names = list(names)
    if order == "fixed":
        return names
    if order == "alternate":
        return names if repeat % 2 == 0 else names[::-1]
    if order == "rotate":
        shift = repeat % len(names) if names else 0
        return names[shift:] + names[:shift]
    raise ValueError(f"unknown round order {order!r}; choose one of {ROUND_ORDERS}")


def timed_round(
    cases: Mapping[str, Callable[[], T]],
    repeat: int,
    order: str = "fixed",
    synchronize: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, tuple[float, T]]:
    """Run every case once, in `round_order`; {name: (wall seconds, output)}. `synchronize` (a device's)
    runs before the clock starts and before it stops, so queued device work is inside the case's time."""
    sync = synchronize or (lambda: None)
    measured: dict[str, tuple[float, T]] = {}
    for name in round_order(list(cases), repeat, order):
        sync()
        started = clock()
        output = cases[name]()
        sync()
        measured[name] = (clock() - started, output)
    return {name: measured[name] for name in cases}


def median_interval(values: list[float], coverage: float = INTERVAL_COVERAGE) -> tuple[float, float]:
    """An interval holding the median with probability >= `coverage` (order statistics x_(k), x_(n+1-k), the
    largest k with P(Binomial(n, 1/2) < k) <= (1 - coverage) / 2); min-max while n is too small for that."""
    ordered = sorted(values)
    n = len(ordered)
    k, tail = 0, 0.0
    while k < n // 2:
        tail_next = tail + math.comb(n, k) / 2**n
        if tail_next > (1 - coverage) / 2:
            break
        tail, k = tail_next, k + 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def is_settled(low: float, high: float) -> bool:
    """The interval excludes 1 (a speedup or a slowdown), or lies inside the no-effect band."""
    return low > 1.0 or high < 1.0 or (NO_EFFECT_BAND[0] <= low and high <= NO_EFFECT_BAND[1])


def run_pairs(
    measure_pair: Callable[[int], float], min_pairs: int, time_limit: float, clock: Callable[[], float] = time.monotonic
) -> tuple[list[float], bool]:
    """Call `measure_pair(i)` (returns one pair's speedup) at least `min_pairs` times, then until the median's
    interval settles or `time_limit` seconds have passed (0: exactly `min_pairs`). Returns (speedups, settled)."""
    from assisted_backends.distributed.agreement import RankAgreement, rank0_decides

    ranks = RankAgreement.current()  # under a launcher every rank must run as many pairs: rank 0's timings decide
    started = clock()
    speedups: list[float] = []
    while True:
        speedups.append(measure_pair(len(speedups)))
        if len(speedups) < min_pairs:
            continue
        settled = is_settled(*median_interval(speedups))
        if rank0_decides(ranks, len(speedups), int(settled or time_limit <= 0 or clock() - started >= time_limit)):
            return speedups, settled

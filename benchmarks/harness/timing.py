"""The interleaved round-robin timing loop: every case once per round, rounds repeated, medians.

Built on `assisted_backends.cli.spread` (the round order and one timed round), which the CLI's
benchmark uses too, so there is one way of interleaving in the repository.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from assisted_backends.cli.spread import timed_round


@dataclass
class Timings:
    """Per case: the wall seconds and the output of every timed call (warm-up calls excluded), in call order."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    outputs: dict[str, list[object]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        """Median seconds of case `name`."""
        return statistics.median(self.seconds[name])

    def medians(self) -> dict[str, float]:
        """{case: median seconds}."""
        return {name: statistics.median(values) for name, values in self.seconds.items()}

    def spread(self) -> dict[str, tuple[float, float]]:
        """{case: (min seconds, max seconds)}."""
        return {name: (min(values), max(values)) for name, values in self.seconds.items()}

    def last(self, name: str) -> object:
        """The output of case `name`'s last timed call."""
        return self.outputs[name][-1]


def interleaved(
    cases: Mapping[str, Callable[[], object]],
    repeats: int,
    warmup: int = 2,
    order: str = "fixed",
    synchronize: Callable[[], None] | None = None,
) -> Timings:
    """Time every case `repeats` times, round-robin, after `warmup` untimed rounds (so drift and neighbours hit
    all cases alike). `order`: `fixed`, `alternate` or `rotate` (see `spread.round_order`); `synchronize`
    runs around each call (a device's synchronize)."""
    for repeat in range(warmup):
        timed_round(cases, repeat, order, synchronize)
    timings = Timings({name: [] for name in cases}, {name: [] for name in cases})
    for repeat in range(repeats):
        for name, (seconds, output) in timed_round(cases, repeat, order, synchronize).items():
            timings.seconds[name].append(seconds)
            timings.outputs[name].append(output)
    return timings


def median_ms(samples: list[float]) -> float:
    """Median of `samples` (seconds) in milliseconds, rounded to 4 decimals."""
    return round(1000 * statistics.median(samples), 4)

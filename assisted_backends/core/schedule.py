"""Draft-length schedules: how many tokens γ to draft in the next round.

The adaptive schedule follows Leviathan et al. (2023): with per-token acceptance α a round that
drafts γ tokens yields E[tokens] = (1 − α^(γ+1)) / (1 − α) and costs γ·t_d + t_v(γ+1), where t_d is
one draft step and t_v(q) one target pass over q tokens. It picks the γ with the highest expected
tokens per second, γ = 0 (plain decoding) included, from α and times measured online on the device;
while γ = 0 wins it probes with γ = 1 now and then, so a rising α is noticed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

SCHEDULE_NAMES = ("adaptive", "constant")
NEVER_PAYS_COST_RATIO = 0.9  # draft parameters / target parameters from which speculation is not tried


@dataclass(frozen=True)
class RoundObservation:
    """What one round cost and yielded. γ = `drafted` (0 in a plain round)."""

    drafted: int
    accepted: int
    draft_s: float  # wall time of the γ draft steps (0 when γ = 0)
    verify_s: float  # wall time of the target pass over γ + 1 tokens, acceptance included


class DraftSchedule(Protocol):
    def draft_length(self) -> int:
        """γ for the next round (0 means: no speculation this round)."""

    def update(self, observation: RoundObservation) -> None:
        """Learn from the round that just ended."""


class ConstantSchedule:
    """Always γ tokens."""

    def __init__(self, gamma: int) -> None:
        if gamma < 1:
            raise ValueError(f"num_assistant_tokens must be >= 1, got {gamma}")
        self.gamma = gamma

    def draft_length(self) -> int:
        return self.gamma

    def update(self, observation: RoundObservation) -> None:
        return None


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per round] = (1 − α^(γ+1)) / (1 − α): accepted drafts plus the target's own token."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """S = (1 − α^(γ+1)) / ((1 − α)(γc + 1)): the walltime speedup when a target pass costs the same for any γ."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


class _Ema:
    """Exponential moving average of a time, robust to what disturbs CPU timings.

    The first sample is dropped (a shape's first call pays for kernel selection and allocation), and
    later samples are clipped at 3x the running value (a descheduled thread is no property of the model).
    """

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.value: float | None = None
        self._warm = False

    def add(self, sample: float) -> None:
        if not self._warm:
            self._warm = True
            return
        if self.value is None:
            self.value = sample
        else:
            self.value = (1 - self.weight) * self.value + self.weight * min(sample, 3 * self.value)


class AdaptiveSchedule:
    """Chooses γ ∈ {0, …, γ_max} maximising E[tokens] / (γ·t_d + t_v(γ+1)).

    α is the decayed success ratio of verification decisions (a round with n of γ accepted shows n
    successes and, if n < γ, one failure), with a Beta(1, 1) prior. t_v(q) is modelled as
    t_v(1) + (q − 1)·b: t_v(1) from plain rounds, b from speculative ones. The first two rounds are
    plain (measure t_v(1)), the next two draft `initial` tokens (measure t_d and b; each estimate
    drops its first sample); a switch to speculation must beat plain decoding by `margin`, so
    break-even pairs (c ≈ α) stay plain.
    """

    def __init__(
        self,
        max_gamma: int = 8,
        initial: int = 3,
        max_probe_interval: int = 32,
        probe_budget: float = 0.02,
        margin: float = 0.03,
        decay: float = 0.95,
        cost_prior: float | None = None,
    ) -> None:
        if max_gamma < 1:
            raise ValueError(f"num_assistant_tokens (the adaptive schedule's maximum γ) must be >= 1, got {max_gamma}")
        self.max_gamma = max_gamma
        self.initial = min(initial, max_gamma)
        self.max_probe_interval = max_probe_interval
        self.probe_budget = probe_budget
        self.never = cost_prior is not None and cost_prior >= NEVER_PAYS_COST_RATIO
        self.margin = margin
        self.decay = decay
        self.successes = 0.0
        self.failures = 0.0
        self.draft_step = _Ema(0.3)  # t_d
        self.plain_pass = _Ema(0.3)  # t_v(1)
        self.per_extra_token = _Ema(0.3)  # b
        self.rounds = 0
        self.plain_streak = 0
        self.chosen: list[int] = []  # γ of every round, for statistics and tests

    @property
    def alpha(self) -> float:
        return (self.successes + 1.0) / (self.successes + self.failures + 2.0)

    def verify_cost(self, gamma: int) -> float:
        base = self.plain_pass.value or 0.0
        return base + gamma * (self.per_extra_token.value or 0.0)

    def tokens_per_second(self, gamma: int) -> float:
        if gamma == 0:
            return 1.0 / max(self.verify_cost(0), 1e-9)
        cost = gamma * (self.draft_step.value or 0.0) + self.verify_cost(gamma)
        return expected_tokens(self.alpha, gamma) / max(cost, 1e-9)

    def best_gamma(self) -> int:
        best = max(range(1, self.max_gamma + 1), key=self.tokens_per_second)
        return best if self.tokens_per_second(best) > (1 + self.margin) * self.tokens_per_second(0) else 0

    def probe_interval(self) -> int:
        """Plain rounds between probes. A γ = 1 probe that accepts nothing costs (t_d + b) / t_v(1) of a
        round more than plain decoding; probing that often keeps the overhead within `probe_budget`."""
        plain = self.plain_pass.value or 1e-9
        overhead = ((self.draft_step.value or 0.0) + (self.per_extra_token.value or 0.0)) / plain
        return max(2, min(self.max_probe_interval, math.ceil(overhead / self.probe_budget)))

    def draft_length(self) -> int:
        if self.never:
            gamma = 0  # a draft about as costly as the target: S <= (γ+1)/(γc+1) <= 1 for c >= 1
        elif self.plain_pass.value is None:
            gamma = 0  # measure t_v(1) (two rounds: the first one's time is dropped)
        elif self.draft_step.value is None:
            gamma = self.initial  # measure α, t_d and b (likewise)
        else:
            gamma = self.best_gamma()
            if gamma == 0 and self.plain_streak >= self.probe_interval():
                gamma = 1  # probe: has α risen?
        self.chosen.append(gamma)
        return gamma

    def update(self, observation: RoundObservation) -> None:
        self.rounds += 1
        gamma, accepted = observation.drafted, observation.accepted
        if gamma == 0:
            self.plain_pass.add(observation.verify_s)
            self.plain_streak += 1
            return
        self.plain_streak = 0
        self.successes = self.decay * self.successes + accepted
        self.failures = self.decay * self.failures + (1.0 if accepted < gamma else 0.0)
        self.draft_step.add(observation.draft_s / gamma)
        if self.plain_pass.value is not None:
            self.per_extra_token.add(max(0.0, observation.verify_s - self.plain_pass.value) / gamma)


def make_schedule(
    name: str | None,
    num_assistant_tokens: int | None,
    fixed_shapes: bool,
    default_gamma: int,
    max_gamma: int,
    cost_prior: float | None = None,
) -> DraftSchedule:
    """`constant` when γ is fixed by the user or by static shapes, else `adaptive` (the default)."""
    if name is not None and name not in SCHEDULE_NAMES:
        raise ValueError(f"schedule={name!r} is not one of {SCHEDULE_NAMES}")
    if name == "adaptive" and fixed_shapes:
        raise ValueError("schedule='adaptive' varies γ, which static shapes forbid; use schedule='constant'")
    if name is None:
        name = "constant" if (num_assistant_tokens is not None or fixed_shapes) else "adaptive"
    if name == "constant":
        return ConstantSchedule(num_assistant_tokens or default_gamma)
    return AdaptiveSchedule(max_gamma=num_assistant_tokens or max_gamma, cost_prior=cost_prior)

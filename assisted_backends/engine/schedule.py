"""Draft-length schedules: how many tokens γ to draft in the next round.

The adaptive schedule generalises Leviathan et al. (2023). With α_i the probability that draft token
i is accepted given that tokens 1..i−1 were, a round that drafts γ tokens yields

    E[tokens](γ) = 1 + Σ_{k=1..γ} Π_{i=1..k} α_i

(Leviathan's (1 − α^(γ+1)) / (1 − α) when every α_i = α) and costs γ·t_d + t_v(γ+1), where t_d is
one draft step and t_v(q) one target pass over q tokens. It picks the γ with the highest expected
tokens per second, γ = 0 (plain decoding) included, from α_i and times measured online on the
device; while γ = 0 wins it probes with γ = 1 now and then, so a rising α is noticed.

Why per position and per q: acceptances are correlated (a draft that got the easy tokens of a phrase
right tends to get the next one right too, so α_i grows with i on real pairs), and a target pass is
not linear in q (on CPU one extra token costs a jump, more tokens then little; on GPUs nearly nothing).
A single α and a linear t_v both underestimate deep drafts (on the demo pair they chose γ ≈ 1 where γ = 4
was faster: benchmarks/RESULTS.md, "Why the code is the way it is").

Batches: one γ for the batch. A round of B rows gains Σ_b (n_b + 1) tokens and costs the batch's
γ·t_d(B) + t_v(B, γ+1), both measured on the batch; every row adds one sample to the α_i (the counts
decay once per round, not once per row). Expected tokens and plain decoding's one token both scale
with B, so the comparison is the one above with the batch's times: once verifying γ + 1 positions of
B rows costs as much as γ + 1 plain steps (compute bound), γ = 0 wins and the schedule stops
speculating by itself. The live batch changes (rows leave when a queue runs dry, `api.queue`), so the
costs are kept by the work of a pass: t_v by the tokens it feeds, M = B·(γ + 1) (a pass over B rows of
γ + 1 tokens does the matmul work of one over B·(γ + 1) rows of one token), t_d by B. A batch that
shrinks from 16 to 12 rows reads t_v(12, 4) between the measured M = 16 and M = 64 and t_v(12, 1) near
M = 16: once compute-bound passes become cheaper, speculation comes back on. Plain passes (q = 1) keep their
own curve, by B: a pass of q > 1 tokens per row may take another path (the native step's attention over several
queries costs 2-3x a plain pass at 4-8 rows), so the same M is not the same price, and a batch that drafted at 4
rows must not read its verify passes as the plain cost of 8. Below the smallest verify pass measured, the plain
curve stands in for it (no jump assumed: optimistic, so the size is tried once, then priced).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

NEVER_PAYS_COST_RATIO = 0.9  # draft parameters / target parameters from which speculation is not tried
COSTLY_DRAFT_RATIO = 0.25  # from this parameter ratio on, exploration drafts 1 token, not 3 (it costs γc steps)
# A free drafter (prompt lookup) has regimes: a copied span accepts long runs, free text rejects x_1. Its
# counts forget in a few rounds, and it explores and probes with the full γ_max (one token would not tell
# a copy apart); with the slow decay and γ = 1 probes it stayed plain after the first rejections.
FREE_DECAY = 0.8
# A draft is tried only if what the try costs when it finds nothing (the draft's pass over the prompt and its
# exploration round) stays within this share of the plain decoding time left (`AdaptiveSchedule.worth_trying`).
TRIAL_BUDGET = 0.02


@dataclass(frozen=True)
class RoundObservation:
    """What one round cost and yielded. γ = `drafted` (0 in a plain round)."""

    drafted: int
    accepted: int
    draft_s: float  # wall time of the γ draft steps (0 when γ = 0)
    verify_s: float  # wall time of the target pass over γ + 1 tokens, acceptance included
    row_accepted: tuple[int, ...] = ()  # batches: n_b of every row still generating (`accepted` is their sum)
    batch: int = 0  # rows the passes fed (filler and finished rows riding along included); 0: the last observed


class DraftSchedule(Protocol):
    def draft_length(self) -> int:
        """γ for the next round (0 means: no speculation this round)."""

    def update(self, observation: RoundObservation) -> None:
        """Learn from the round that just ended."""

    def observe_prefill(self, seconds: float) -> None:
        """The target's prompt pass took `seconds` (before the first round)."""

    def observe_batch(self, rows: int) -> None:
        """The next round feeds `rows` rows (the live batch: it changes as rows leave and join)."""


class ConstantSchedule:
    """Always γ tokens."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma  # >= 1 (`options.ranges`)

    def draft_length(self) -> int:
        return self.gamma

    def update(self, observation: RoundObservation) -> None:
        return None

    def observe_prefill(self, seconds: float) -> None:
        return None

    def observe_batch(self, rows: int) -> None:
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

    The first sample stands alone until a second one replaces it if lower (a shape's first call may
    pay for kernel selection and allocation: a pessimistic start, corrected at once), and later
    samples are clipped at 3x the running value (a descheduled thread is no property of the model).
    """

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.value: float | None = None
        self.samples = 0

    def add(self, sample: float) -> None:
        self.samples += 1
        if self.value is None:
            self.value = sample
        elif self.samples == 2:
            self.value = min(self.value, sample)
        else:
            self.value = (1 - self.weight) * self.value + self.weight * min(sample, 3 * self.value)


class _PositionAcceptance:
    """Conditional acceptance rates α_1..α_γmax from decayed per-position counts.

    A round that drafted γ and accepted n adds a success at positions 1..n and, if n < γ, a failure at
    position n + 1 (positions past it were not decided). Each α_i is shrunk towards α_{i−1} with
    `prior_weight` pseudo-trials (α_1 towards `first_prior`: 1/2, a uniform Beta(1, 1) prior, unless the draft's
    acceptance is known), so a position seldom reached inherits its predecessor's rate instead of a guess.
    """

    def __init__(self, max_gamma: int, decay: float, prior_weight: float = 2.0, first_prior: float = 0.5) -> None:
        self.decay = decay
        self.prior_weight = prior_weight
        self.first_prior = first_prior
        self.successes = [0.0] * max_gamma
        self.trials = [0.0] * max_gamma

    def update(self, gamma: int, accepted: int) -> None:
        self.update_rows(gamma, (accepted,))

    def update_rows(self, gamma: int, accepted: tuple[int, ...]) -> None:
        """One round of γ drafted tokens in which row b accepted accepted[b]: the counts decay once (per round,
        so a batch of 16 rows forgets at the pace of one row), then every row adds its sample."""
        self.successes = [self.decay * value for value in self.successes]
        self.trials = [self.decay * value for value in self.trials]
        for n in accepted:
            for i in range(min(n + 1, gamma)):
                self.trials[i] += 1.0
                self.successes[i] += 1.0 if i < n else 0.0

    def any_accepted(self) -> bool:
        return any(value > 0 for value in self.successes)

    def rates(self) -> list[float]:
        """[α_1, …, α_γmax]."""
        rates, previous = [], self.first_prior
        for successes, trials in zip(self.successes, self.trials):
            previous = (successes + self.prior_weight * previous) / (trials + self.prior_weight)
            rates.append(previous)
        return rates

    def expected_tokens_by_gamma(self) -> list[float]:
        """[E(0), E(1), …, E(γmax)] with E(γ) = 1 + Σ_{k≤γ} Π_{i≤k} α_i, in one pass."""
        expected, survive = [1.0], 1.0
        for rate in self.rates():
            survive *= rate
            expected.append(expected[-1] + survive)
        return expected

    def expected_tokens(self, gamma: int) -> float:
        return self.expected_tokens_by_gamma()[gamma]


class _VerifyCost:
    """A cost by the size of the work, one robust average per size: t_v(M), the wall time of one target pass
    feeding M tokens (B rows of q = γ + 1 tokens: M = B·q; one row: M = q), or t_d(B), one draft step over B rows.

    A size measured at least twice is *settled*. A size not settled is interpolated between the nearest
    settled sizes below and above, or, past either end, taken as equal to the nearest one: optimistic past
    the largest, so the schedule tries it and learns. A size measured once is taken as at most that
    estimate: the first pass of a shape pays for its kernels and buffers (a few times the later ones), and one
    inflated sample must not rule a width out for good.
    """

    def __init__(self, max_query: int | None = None) -> None:  # `max_query`: kept for callers; sizes are open
        self.by_size: dict[int, _Ema] = {}

    def add(self, size: int, seconds: float) -> None:
        self.by_size.setdefault(size, _Ema(0.3)).add(seconds)

    def samples(self, size: int | None = None) -> int:
        """Samples at `size` (None: at every size together)."""
        if size is None:
            return sum(ema.samples for ema in self.by_size.values())
        own = self.by_size.get(size)
        return own.samples if own is not None else 0

    def settled_at_most(self, size: int) -> bool:
        """Whether some size <= `size` was measured at least twice."""
        return any(q <= size and ema.samples >= 2 for q, ema in self.by_size.items())

    def measured(self) -> list[tuple[int, float, int]]:
        """(size, seconds, samples) of every measured size, ascending."""
        return sorted((q, ema.value, ema.samples) for q, ema in self.by_size.items())

    def __call__(self, size: int, below: _VerifyCost | None = None) -> float:
        """The estimate at `size`; `below`: a curve whose sizes under this one's smallest stand in for it there."""
        measured = self.measured()
        if below is not None:
            smallest = measured[0][0] if measured else None
            measured = [m for m in below.measured() if smallest is None or m[0] < smallest] + measured
        if not measured:
            return 0.0
        points = [(q, v) for q, v, samples in measured if samples >= 2] or [(q, v) for q, v, _ in measured]
        estimate = _interpolate(points, size)
        own = self.by_size.get(size)
        return min(own.value, estimate) if own is not None else estimate


def _interpolate(known: list[tuple[int, float]], query_length: int) -> float:
    """Linear between the nearest known q below and above `query_length`; the nearest one past either end."""
    below = [(q, v) for q, v in known if q <= query_length]
    above = [(q, v) for q, v in known if q >= query_length]
    if not below:
        return above[0][1]
    if not above:
        return below[-1][1]
    (q0, v0), (q1, v1) = below[-1], above[0]
    return v0 if q1 == q0 else v0 + (v1 - v0) * (query_length - q0) / (q1 - q0)


class AdaptiveSchedule:
    """Chooses γ ∈ {0, …, γ_max} maximising E[tokens](γ) / (γ·t_d + t_v(γ+1)).

    α_i come from `_PositionAcceptance` (decayed counts), t_v(B, q) from `_VerifyCost` keyed by the tokens a
    pass feeds (M = B·q, B the live batch of `observe_batch`), t_d(B) from the draft time per drafted token. The
    first two rounds are plain (measure t_v(1)); the next one drafts `initial` tokens (measure t_d, t_v(initial
    + 1) and α_1..α_initial), and so does a second one if the first accepted anything (a free drafter explores at
    once). Then γ follows the estimates, once plain decoding's time at the live batch rests on two passes (a free
    drafter that never measured it priced t_v(B) as its narrowest speculative pass, and one inflated first pass is
    a warm-up's: either kept prompt lookup drafting at 8 rows where plain rounds were 3x cheaper); an unmeasured
    t_v(q) is taken as the largest measured one and an unreached α_i as α_{i−1}, so a good draft is pushed deeper
    round by round, and while plain decoding wins, a γ = 1 probe (the cheapest) runs
    now and then, ever more rarely while probes find nothing (`probe_wait`). A switch to speculation must beat
    plain decoding by `margin`, so break-even pairs (c ≈ α) stay plain. A draft whose try would cost more than
    `trial_budget` of the plain decoding left is never tried (`worth_trying`), so plain decoding is the worst
    case, within the budgets.
    """

    def __init__(
        self,
        max_gamma: int = 8,
        initial: int | None = None,  # None: 3; 1 if cost_prior >= COSTLY_DRAFT_RATIO; γ_max for a free drafter
        max_probe_interval: int = 256,  # a costly probe (a deep draft catching up on the plain rounds) stays rare
        probe_budget: float = 0.02,
        margin: float = 0.03,
        decay: float | None = None,  # None: 0.95, or FREE_DECAY for a free drafter
        cost_prior: float | None = None,
        horizon: int | None = None,  # tokens the generation makes per row (max_new_tokens), if known
        prompt_pass_prior: float = 0.0,  # the draft's pass over the prompt / the target's (0: it reads none)
        trial_budget: float = TRIAL_BUDGET,
        acceptance_prior: float | None = None,  # α_1 measured before the call (an EAGLE head's held-out α_1)
    ) -> None:
        self.max_gamma = max_gamma
        self.cost_prior = cost_prior or 0.0
        self.prompt_pass_prior = prompt_pass_prior
        self.trial_budget = trial_budget
        self.target_prefill_s = 0.0
        self.declined = False  # the draft was judged not worth trying: plain decoding to the end
        self.free = cost_prior == 0.0  # no draft model (prompt lookup): trying costs only the verify pass
        if initial is None:
            costly = cost_prior is not None and cost_prior >= COSTLY_DRAFT_RATIO
            initial = max_gamma if self.free else (1 if costly else 3)
        self.initial = min(initial, max_gamma)
        self.probe_gamma = max_gamma if self.free else 1
        self.max_probe_interval = max_probe_interval
        self.probe_budget = probe_budget
        decay = decay if decay is not None else (FREE_DECAY if self.free else 0.95)
        self.never = cost_prior is not None and cost_prior >= NEVER_PAYS_COST_RATIO
        self.margin = margin
        first_prior = 0.5 if acceptance_prior is None else min(max(acceptance_prior, 0.0), 1.0)
        self.acceptance = _PositionAcceptance(max_gamma, decay, first_prior=first_prior)
        self.draft_step = _VerifyCost()  # t_d(B), by the rows of the batch
        self.plain_cost = _VerifyCost()  # t_v(B, 1) by the rows B
        self.verify_cost = _VerifyCost()  # t_v(B, q > 1) by the tokens a pass feeds, M = B·q
        self.batch = 1  # rows the next round feeds (`observe_batch`)
        self.plain_measured = 0  # plain rounds observed, at any batch size
        self.rounds = 0
        self.plain_streak = 0
        self.horizon = horizon
        self.made = 1.0  # tokens made per row so far, the prefill's included (batches: the mean over rows)
        self.failed_probes = 0  # probes in a row that accepted nothing (each doubles the wait before the next)
        self._probing = False
        self.chosen: list[int] = []  # γ of every round, for statistics and tests

    def verify(self, query_length: int) -> float:
        """t_v(B, q): one target pass over q tokens of each of the B rows of the live batch."""
        if query_length == 1:
            return self.plain_cost(self.batch)
        return self.verify_cost(self.batch * query_length, below=self.plain_cost)

    def draft_seconds(self) -> float:
        """t_d(B): one draft step over the live batch (0 before any was measured)."""
        return self.draft_step(self.batch)

    def observe_batch(self, rows: int) -> None:
        self.batch = max(1, rows)

    def tokens_per_second(self) -> list[float]:
        """Expected tokens per second per row for γ = 0 (plain), 1, …, γ_max: E(γ) / (γ·t_d + t_v(γ+1)), at the
        live batch."""
        expected = self.acceptance.expected_tokens_by_gamma()
        t_d = self.draft_seconds()
        return [expected[g] / max(g * t_d + self.verify(g + 1), 1e-9) for g in range(self.max_gamma + 1)]

    def best_gamma(self) -> int:
        rates = self.tokens_per_second()
        best = max(range(1, self.max_gamma + 1), key=rates.__getitem__)
        return best if rates[best] > (1 + self.margin) * rates[0] else 0

    def probe_interval(self) -> int:
        """Plain rounds between probes. A probe of γ_p tokens that accepts nothing costs
        (γ_p·t_d + t_v(γ_p + 1) − t_v(1)) / t_v(1) of a round more than plain decoding; probing that often keeps
        the overhead within `probe_budget`."""
        plain = max(self.verify(1), 1e-9)
        probe = self.probe_gamma
        overhead = (probe * self.draft_seconds() + max(0.0, self.verify(probe + 1) - plain)) / plain
        return max(2, min(self.max_probe_interval, math.ceil(overhead / self.probe_budget)))

    def probe_wait(self) -> int:
        """Plain rounds before the next probe: `probe_interval`, doubled by each probe in a row that accepted
        nothing (a free drafter's regimes change within a few rounds: its wait stays). A probe's full cost (the
        draft catching up on the plain rounds, the round's own bookkeeping) is more than `probe_interval` prices,
        so a draft that keeps failing is asked O(log rounds) times, not once an interval."""
        if self.free:
            return self.probe_interval()
        return min(self.max_probe_interval, self.probe_interval() << min(self.failed_probes, 16))

    def worth_probing(self) -> bool:
        """A probe pays back over the rounds after it: none is made with fewer tokens left than the plain
        rounds whose budget pays for it (a probe near the end of an answer makes the draft catch up on every
        token so far, for nothing)."""
        return self.horizon is None or self.horizon - self.made > self.probe_interval()

    def observe_prefill(self, seconds: float) -> None:
        self.target_prefill_s = seconds

    def trial_cost(self) -> float:
        """Seconds a try of the draft adds when it finds nothing: its pass over the prompt (the target's,
        scaled by `prompt_pass_prior`) and the exploration round's `initial` draft steps (c·t_v(1) each)."""
        return self.prompt_pass_prior * self.target_prefill_s + self.initial * self.cost_prior * self.verify(1)

    def worth_trying(self) -> bool:
        """Try the draft only if `trial_cost` is within `trial_budget` of the plain decoding time left
        (horizon − made tokens at t_v(1)): a draft of c near 1 cannot gain, and its try alone costs several percent of
        a short answer."""
        if self.horizon is None or self.free:
            return True
        plain_left = (self.horizon - self.made) * self.verify(1)
        return self.trial_cost() <= self.trial_budget * plain_left

    def draft_length(self) -> int:
        if self.never or self.declined:
            gamma = 0  # as costly as the target (S <= (γ+1)/(γc+1) <= 1 for c >= 1), or its try is over budget
        elif self.plain_measured < 2 and not self.free:
            gamma = 0  # measure t_v(1), twice: plain rounds cost nothing extra (a free drafter starts at once)
        elif self.draft_step.samples() == 0 and not self.worth_trying():
            self.declined = True  # the budget only shrinks as tokens are made: decided for good
            gamma = 0
        elif self.draft_step.samples() == 0 or (self.draft_step.samples() == 1 and self.acceptance.any_accepted()):
            # measure α_i, t_d and t_v(initial + 1): one round for a draft that got nothing right,
            # two for one that did, so that a single warm-up-inflated time does not end speculation
            gamma = self.initial
        elif not self.plain_cost.settled_at_most(self.batch):
            gamma = 0  # plain decoding's time at this batch rests on no pass or one (perhaps a warm-up's): measure it
        else:
            gamma = self.best_gamma()
            if gamma == 0 and self.plain_streak >= self.probe_wait() and self.worth_probing():
                gamma = self.probe_gamma  # probe: has α risen?
                self._probing = True
        self.chosen.append(gamma)
        return gamma

    def update(self, observation: RoundObservation) -> None:
        self.rounds += 1
        probed, self._probing = self._probing, False  # a probe the drafter did not draft for counts as none
        gamma = observation.drafted
        batch = observation.batch or self.batch
        rows = observation.row_accepted or (observation.accepted,)
        self.made += 1 + sum(rows) / len(rows)
        if gamma == 0:
            self.plain_cost.add(batch, observation.verify_s)
            self.plain_measured += 1
            self.plain_streak += 1
            return
        self.verify_cost.add(batch * (gamma + 1), observation.verify_s)
        self.plain_streak = 0
        if sum(rows) > 0:
            self.failed_probes = 0
        elif probed:
            self.failed_probes += 1
        self.acceptance.update_rows(gamma, rows)  # a batch: one sample per row
        self.draft_step.add(batch, observation.draft_s / gamma)


class SourceSchedule:
    """One adaptive schedule per drafting source, for a drafter that picks its source each round (an EAGLE-3 head
    with prompt lookup first, `drafters.eagle.combined`): `source()` names the source the next round drafts from,
    and that source's schedule chooses γ and learns from the round. So each source keeps its own α_i and draft
    time: lookup's long accepted copies do not make a head that is rarely right draft where lookup has no match,
    and a source whose drafts do not pay falls back to plain rounds alone. The target's verify cost t_v is one
    measurement, shared; so are the tokens made (the horizon rules)."""

    def __init__(self, schedules: dict[str, AdaptiveSchedule], source: Callable[[], str]) -> None:
        self.schedules = schedules
        self.source = source
        shared = next(iter(schedules.values()))
        for schedule in schedules.values():
            schedule.plain_cost, schedule.verify_cost = shared.plain_cost, shared.verify_cost
        self.current = next(iter(schedules))
        self.chosen: list[tuple[str, int]] = []  # (source, γ) of every round

    def draft_length(self) -> int:
        self.current = self.source()
        gamma = self.schedules[self.current].draft_length()
        self.chosen.append((self.current, gamma))
        return gamma

    def update(self, observation: RoundObservation) -> None:
        schedule = self.schedules[self.current]
        made = schedule.made
        schedule.update(observation)
        for other in self.schedules.values():
            if other is not schedule:
                other.made += schedule.made - made
                other.plain_measured += observation.drafted == 0

    def observe_prefill(self, seconds: float) -> None:
        for schedule in self.schedules.values():
            schedule.observe_prefill(seconds)

    def observe_batch(self, rows: int) -> None:
        for schedule in self.schedules.values():
            schedule.observe_batch(rows)


@dataclass(frozen=True)
class ScheduleSpec:
    """How γ is chosen: "constant" (always `gamma`) or "adaptive" (up to `gamma`), with the adaptive priors."""

    name: str
    gamma: int
    cost_prior: float | None = None
    prompt_pass_prior: float = 0.0
    horizon: int | None = None
    acceptance_prior: float | None = None

    def build(self) -> DraftSchedule:
        if self.name == "constant":
            return ConstantSchedule(self.gamma)
        return AdaptiveSchedule(
            max_gamma=self.gamma,
            cost_prior=self.cost_prior,
            horizon=self.horizon,
            prompt_pass_prior=self.prompt_pass_prior,
            acceptance_prior=self.acceptance_prior,
        )


@dataclass(frozen=True)
class ScheduleChoice:
    """What a call's schedule is chosen from (`choose_schedule`): the caller's `name` and `num_assistant_tokens`
    (None: not given), whether static shapes or seeded sampling fix γ, the γ of a constant schedule and the most
    an adaptive one tries (`default_gamma`, `max_gamma`: the drafter's), and the adaptive schedule's priors
    (`ScheduleSpec`)."""

    name: str | None
    num_assistant_tokens: int | None
    default_gamma: int
    max_gamma: int
    static_shapes: bool = False
    seeded_sampling: bool = False
    cost_prior: float | None = None
    prompt_pass_prior: float = 0.0
    horizon: int | None = None
    acceptance_prior: float | None = None


def choose_schedule(choice: ScheduleChoice) -> ScheduleSpec:
    """`constant` when γ is fixed by the user or by static shapes, or when sampling with a seed; else
    `adaptive` (the default). Names and combinations were checked by `options.ranges.check_shapes`.

    Seeded sampling gets a constant γ by default because the adaptive schedule chooses γ from wall
    times, and which random numbers a round draws depends on γ: the tokens would follow the same
    distribution but differ from run to run. `schedule="adaptive"` still asks for it explicitly.
    """
    name, gamma = choice.name, choice.num_assistant_tokens
    if name is None:
        fixed = gamma is not None or choice.static_shapes or choice.seeded_sampling
        name = "constant" if fixed else "adaptive"
    if name == "constant":
        return ScheduleSpec("constant", gamma or choice.default_gamma)
    priors = (choice.cost_prior, choice.prompt_pass_prior, choice.horizon, choice.acceptance_prior)
    return ScheduleSpec("adaptive", gamma or choice.max_gamma, *priors)


class TreePrice:
    """Chain or token tree, by measured cost (`engine.token_tree`): t_v(M), the verify pass over M query positions of
    one row's round, is averaged per M (`_VerifyCost`); a tree of M' queries whose drafter expects E' tokens accepted
    is verified instead of its chain (M queries, E expected) when (E' + 1) / t_v(M') >= (E + 1) / t_v(M): the wider
    pass must be paid back by the tokens it is expected to add. An M' never measured is taken as the nearest measured
    one (tried once, then priced)."""

    def __init__(self) -> None:
        self.cost = _VerifyCost()
        self.trees = 0  # rounds that verified a tree
        self.declined = 0  # trees offered but priced out (their chain verified)

    def observe(self, queries: int, seconds: float) -> None:
        self.cost.add(queries, seconds)

    def worth(self, chain_queries: int, tree_queries: int, chain_expected: float, tree_expected: float) -> bool:
        t_chain, t_tree = self.cost(chain_queries), self.cost(tree_queries)
        if t_chain <= 0.0 or t_tree <= 0.0:
            return True  # nothing measured yet
        wanted = (tree_expected + 1.0) / t_tree >= (chain_expected + 1.0) / t_chain
        self.declined += not wanted
        return wanted

"""Rank agreement: under a multi-card launch every rank takes the same decisions, or the run stops with an error.

Under tensor parallelism every rank runs the whole decoding loop and the sharded target all-reduces
inside its forward. A rank that drafts another γ, samples another token or stops one round earlier
sends a collective of another size (gloo aborts: "op.preamble.length <= op.nbytes") or one its peers
never join (a hang). What must be equal on every rank, and where it is made so:

- prompt, max_new_tokens, sampling, seed given, bucket and cache sizes, max γ: the caller passes the
  same arguments on every rank; checked by `RankAgreement.start` (1 collective per generate call).
- the random seed when sampling: rank 0's (drawn from torch's global RNG when none was given), sent by
  `RankAgreement.start`; every rank seeds its own generator with it, so the draws are identical as
  long as the calls are.
- γ of each round and the probes of the adaptive schedule (chosen from this rank's wall times): rank
  0's schedule decides, the other ranks take its γ: `AgreedSchedule.draft_length` (1 collective per
  round). The constant schedule, static shapes and their buckets are constants or functions of the
  checked arguments: nothing is sent per round.
- draft tokens: the draft is replicated (same weights, same input, same kernels: same tokens);
  prompt lookup and other-tokenizer drafts are functions of the committed tokens.
- target logits: the sharded forward all-reduces; every rank receives the same sums and computes the
  rest on identical values.
- accepted count, bonus token, EOS / stop strings, end of the loop: functions of identical draft
  tokens, logits (greedy: their argmax) and random draws. Checked all the same: the accept history
  rides on each round's collective, the generated tokens on one at the end (`watched`).

Every collective here is one all-reduce (MAX) of 10 int64 on a gloo group of its own (CPU, so no
device sync, and never confused with the target's all-reduces), bounded by `collective_timeout_s()`.
A single process (no process group, or a world of one) gets `current() -> None`: nothing is sent.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta

import torch

TIMEOUT_ENV = "ASSISTED_BACKENDS_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
_MODULUS = (1 << 61) - 1  # fingerprints fit an int64 with their negation
_UNDECIDED = -(1 << 62)  # what ranks other than 0 contribute to a decided value (MAX keeps rank 0's)
_PHASES = {1: "start of generation", 2: "round", 3: "end of generation", 4: "benchmark pair"}
_CHECKED = ("phase", "step", "fingerprint", "length")
_COLLECTIVE_WORDS = ("gloo", "hccl", "nccl", "connection", "peer", "collective")
_group_cache: list = []  # [(default group, agreement group)]: one agreement group per process group


class RankFailure(RuntimeError):
    """A multi-rank run stopped: a collective timed out or failed, or ranks disagreed. Names the rank and step."""


def collective_timeout_s(environ=None) -> float:
    """The bound on every collective, in seconds: `ASSISTED_BACKENDS_COLLECTIVE_TIMEOUT_S`, default 300."""
    text = (os.environ if environ is None else environ).get(TIMEOUT_ENV)
    if text is None or text == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{TIMEOUT_ENV}={text!r} must be a positive number of seconds, e.g. {TIMEOUT_ENV}=300")
    return value


def fingerprint(values: Iterable[int], start: int = 0) -> int:
    """A polynomial hash of a sequence of ints in [0, 2^61 − 1): equal sequences, equal fingerprints."""
    value = start
    for item in values:
        value = (value * 1_000_003 + int(item) + 1) % _MODULUS
    return value


def _agreement_group(timeout: timedelta):
    """A gloo group over all ranks, created once per process group (a collective call: every rank gets here)."""
    import torch.distributed as dist

    world = dist.group.WORLD
    if not (_group_cache and _group_cache[0][0] is world):
        _group_cache[:] = [(world, dist.new_group(backend="gloo", timeout=timeout))]
    return _group_cache[0][1]


class RankAgreement:
    """The ranks of the current process group, agreeing on one generation's decisions."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, group=None) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.group = group
        self.where = "start of generation"  # for error messages: what this rank was doing

    @classmethod
    def current(cls) -> RankAgreement | None:
        """The launch this process is part of, or None for one process (then nothing is ever sent)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return None
        timeout_s = collective_timeout_s()
        group = _agreement_group(timedelta(seconds=timeout_s))
        return cls(dist.get_rank(), dist.get_world_size(), timeout_s, group)

    def agree(self, phase: int, step: int, decided: Sequence[int], checked: Sequence[int]) -> list[int]:
        """One all-reduce: returns rank 0's `decided` (two ints >= 0); raises `RankFailure` if any
        rank's (phase, step, *checked) differs from another's, or if the collective does not complete
        within the timeout."""
        import torch.distributed as dist

        values = [phase, step, *checked]
        mine = list(decided) if self.rank == 0 else [_UNDECIDED] * len(decided)
        payload = torch.tensor(mine + values + [-v for v in values], dtype=torch.int64)  # [2 + 2·4]
        self.where = f"{_PHASES[phase]} {step}" if phase in (2, 4) else _PHASES[phase]
        work = dist.all_reduce(payload, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        try:
            work.wait(timeout=timedelta(seconds=self.timeout_s))
        except RuntimeError as error:
            raise self.failure(error) from error
        result = payload.tolist()
        n = len(decided)
        highest, lowest = result[n : n + len(values)], [-v for v in result[n + len(values) :]]
        differ = [name for name, hi, lo in zip(_CHECKED, highest, lowest) if hi != lo]
        if differ:
            raise RankFailure(self._disagreement(phase, differ))
        return result[:n]

    def _disagreement(self, phase: int, differ: list[str]) -> str:
        prefix = f"rank {self.rank} of {self.world_size}, at {self.where}: "
        if "phase" in differ or "step" in differ:
            return prefix + "the ranks are at different points of the generation (they took different decisions)"
        if phase == 1:
            return prefix + (
                "the ranks called generate with different arguments (input_ids, max_new_tokens, seed, sampling, "
                "bucket/cache sizes must be the same on every rank)"
            )
        if phase == 2:
            return prefix + "the ranks accepted different numbers of draft tokens (did the draft replicas differ?)"
        return prefix + "the ranks generated different tokens (are the draft replicas identical on every rank?)"

    def failure(self, error: BaseException, detail: str = "") -> RankFailure:
        """`error` (a timeout, a lost peer) as a `RankFailure` naming this rank and step."""
        text = str(error).strip()
        lowered = text.lower()
        if "timed out" in lowered or "timeout" in lowered:
            cause = (
                f"a collective did not complete within {self.timeout_s:g} s ({TIMEOUT_ENV}); a peer is stuck or gone"
            )
        elif isinstance(error, torch.distributed.DistError) or any(word in lowered for word in _COLLECTIVE_WORDS):
            cause = "a collective failed; a peer is gone or took another path"
        else:
            cause = "failed"
        return RankFailure(f"rank {self.rank} of {self.world_size}, at {self.where}{detail}: {cause} ({text})")

    def start(self, seed: int | None, sampling: bool, input_ids: torch.Tensor, settings: Sequence[int]) -> int | None:
        """Check that every rank generates from the same prompt and settings; the seed every rank uses."""
        given = -1 if seed is None else int(seed)
        chosen = given
        if sampling and seed is None and self.rank == 0:
            chosen = int(torch.randint(0, 2**31 - 1, (1,)))  # torch.manual_seed before generate makes it repeatable
        prompt = input_ids.reshape(-1).tolist()
        checked = [fingerprint([*settings, int(sampling), given], fingerprint(prompt)), len(prompt)]
        agreed, _ = self.agree(1, 0, [max(chosen, 0), 0], checked)
        return agreed if sampling else seed

    def finish(self, tokens: torch.Tensor, rounds: int) -> None:
        """Check that every rank committed the same tokens in the same number of rounds."""
        committed = tokens.reshape(-1).tolist()
        self.agree(3, rounds, [0, 0], [fingerprint(committed), len(committed)])

    def schedule(self, schedule):
        """`schedule` as every rank must see it: wrapped when its γ may differ between ranks."""
        from assisted_backends.engine.schedule import ConstantSchedule

        if schedule is None or isinstance(schedule, ConstantSchedule):
            return schedule  # γ is a constant: nothing to agree on, nothing sent per round
        return AgreedSchedule(schedule, self)


class AgreedSchedule:
    """A draft schedule whose γ rank 0 decides and every rank takes: one all-reduce per round.

    The adaptive schedule picks γ (and when to probe) from this rank's own wall times, which differ
    between ranks. Rank 0 asks its schedule; the others receive that γ. The same collective carries
    a fingerprint of every rank's (γ, accepted) history, so ranks that diverged stop with an error
    before the target's next all-reduce.
    """

    def __init__(self, inner, ranks: RankAgreement) -> None:
        self.inner, self.ranks = inner, ranks
        self.rounds = 0
        self.history = 0  # fingerprint of [(γ, n) of every round so far]

    def draft_length(self) -> int:
        self.rounds += 1
        proposed = self.inner.draft_length() if self.ranks.rank == 0 else 0
        gamma, _ = self.ranks.agree(2, self.rounds, [proposed, 0], [self.history, 0])
        return gamma

    def update(self, observation) -> None:
        self.history = fingerprint([observation.drafted, observation.accepted], self.history)
        self.inner.update(observation)  # every rank learns; only rank 0's estimates are used

    def __getattr__(self, name: str):  # the inner schedule's attributes (max_gamma, chosen, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def rank0_decides(ranks: RankAgreement | None, step: int, value: int) -> int:
    """Rank 0's `value` (an int >= 0) on every rank; `value` itself for one process. For loops whose
    length depends on wall time (a benchmark's "measure until settled")."""
    if ranks is None:
        return value
    decided, _ = ranks.agree(4, step, [value, 0], [0, 0])
    return decided


@contextmanager
def watched(ranks: RankAgreement | None, buffer, stats) -> Iterator[None]:
    """Around one generation's loop: a failed or timed-out collective (the target's own all-reduces
    included) becomes a `RankFailure` naming the rank and step; at the end, every rank's tokens are
    compared. Does nothing for one process."""
    if ranks is None:
        yield
        return
    try:
        yield
    except RankFailure:
        raise
    except RuntimeError as error:  # torch.distributed's errors are RuntimeErrors (DistError included)
        committed = sum(buffer.new_tokens)
        ranks.where = "prefill" if committed == 0 else f"round {stats.rounds + 1}"
        raise ranks.failure(error, f" ({committed} new tokens committed)") from error
    ranks.finish(torch.cat([buffer.results[row] for row in sorted(buffer.results)]), stats.rounds)

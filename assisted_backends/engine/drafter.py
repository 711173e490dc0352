"""The `Drafter` protocol: what the loop (`engine.loop`) asks of whatever proposes γ tokens for the target to verify.

The protocol belongs to the layer that calls it: drafters (`assisted_backends.drafters`) implement it, the engine
never imports them. A drafter writes its proposal into the slots' scratch space (columns
[length, length + γ)) and, when sampling, returns q [B, γ, V]: the exact distributions it drew from. After
verification the loop calls `rollback` so the drafter's state matches the committed tokens again. A drafter
that can draft no further (its positions end) sets `stopped` and proposes nothing from then on: the draft only
ever changes speed, never whether a call runs.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import torch

from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.schedule import DraftSchedule
from assisted_backends.engine.slots import Slots
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.token_tree import TokenTree

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class Proposal:
    """`count` draft tokens now sit at slots.ids[:, length : length + count] (written with `Slots.write_draft`).

    q [B, count, V_target] is the distribution each was drawn from when sampling (None for greedy).
    A drafter may propose fewer than the γ asked for (a lookup with no match, a re-tokenization that
    came out shorter), never more; under static shapes it must propose exactly γ.
    """

    count: int
    q: torch.Tensor | None = None
    tree: TokenTree | None = None  # one row: the chain as nodes 0..count−1 plus other branches (`engine.token_tree`)
    tree_expected: tuple[float, float] | None = None  # the drafter's expected tokens accepted: (chain, tree)

    def cut(self, count: int) -> Proposal:
        """The first `count` drafts only (itself when that is all of them; a cut chain drops its tree)."""
        if count == self.count:
            return self
        return Proposal(count, self.q[:, :count] if self.q is not None else None)


class Drafter(ABC):
    name: str
    stopped: str | None = None  # why drafting stopped for the rest of the call (None: it did not)

    @property
    @abstractmethod
    def forward_count(self) -> int: ...

    @abstractmethod
    def prefill(self, slots: Slots) -> None:
        """See the committed tokens (called once, before the first proposal; the last one may stay pending)."""

    @abstractmethod
    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        """Write up to γ tokens at slots.ids[:, length : length + γ] (`Slots.write_draft`)."""

    @abstractmethod
    def rollback(self, slots: Slots) -> None:
        """Forget everything past the committed tokens."""

    @abstractmethod
    def move_rows(self, move: RowMove, slots: Slots) -> None:
        """Batches: the slots' rows just moved by `move` (`engine.realign`, `Slots.move`); follow them."""

    @abstractmethod
    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        """Queues (`engine.joins`): slot `slot` holds a new prompt, at columns [slots.padding.host[slot],
        slots.length − 1), its first new token at column slots.length − 1; take it in. `width`: the columns a one-row
        pass over the prompt feeds (its bucket under static shapes), padded with `pad_id`."""

    def schedule_for(self, schedule: DraftSchedule, slots: Slots) -> DraftSchedule:
        """The schedule the loop runs this drafter with, given the call's `schedule`: that one, unless the drafter
        has several sources whose rounds learn their lengths apart (`drafters.eagle.combined`)."""
        return schedule


class DraftFailedWarning(RuntimeWarning):
    """The draft raised: the call goes on with plain decoding (the tokens are the target's either way)."""


class GuardedDrafter:
    """The loop's handle on a drafter (or on none) and the call's slots: every call guarded, so that the first
    exception the draft raises becomes one `DraftFailedWarning` and the call goes on with plain rounds (`active`
    False from then on). The drafter sees the committed tokens (`prefill`) only when first asked to draft (`ready`),
    so a schedule that never speculates never pays for it. The slots are the ones the state holds: the round hands
    them on to the drafter, never the other way round."""

    def __init__(self, drafter: Drafter | None, slots: Slots) -> None:
        self.drafter = drafter  # kept after a failure, for the statistics
        self.slots = slots
        self.active = drafter is not None
        self._prefilled = False

    def _call(self, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """`method(*args)` of the drafter, or None (and the drafter inactive) if it raised."""
        try:
            return method(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any failure of the draft: the target alone still serves the call
            self.drafter.stopped = f"the draft raised {type(error).__name__}: {error}"
            warnings.warn(
                f"{self.drafter.name}: {self.drafter.stopped}; plain decoding from here on", DraftFailedWarning, 4
            )
            self.active = False
            return None

    @property
    def name(self) -> str:
        return self.drafter.name if self.drafter is not None else "no draft"

    def ready(self) -> bool:
        """Whether the drafter can propose; the first time, it sees the committed tokens (`Drafter.prefill`)."""
        if self.active and not self._prefilled:
            self._prefilled = True
            self._call(self.drafter.prefill, self.slots)
        return self.active

    def propose(self, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        """Up to γ draft tokens at slots.ids[:, length : length + γ] (none when γ = 0 or the draft failed)."""
        if gamma == 0 or not self.active:
            return Proposal(0)
        proposal = self._call(self.drafter.propose, self.slots, gamma, selector, generator)
        return proposal if proposal is not None else Proposal(0)

    def rollback(self) -> None:
        if self.active:
            self._call(self.drafter.rollback, self.slots)

    def move_rows(self, move: RowMove) -> None:
        if self.active:
            self._call(self.drafter.move_rows, move, self.slots)

    def insert_row(self, slot: int, width: int, pad_id: int) -> None:
        if self.active:
            self._call(self.drafter.insert_row, self.slots, slot, width, pad_id)

    def note_stop(self, stats: GenerationStats) -> None:
        """Record when and why drafting stopped for the rest of the call (once)."""
        if self.drafter is not None and self.drafter.stopped is not None and stats.drafting_stopped is None:
            stats.record_stop(self.drafter.stopped, sum(self.slots.new_tokens))

    @property
    def forward_count(self) -> int:
        return self.drafter.forward_count if self.drafter is not None else 0

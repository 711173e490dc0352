"""`DecodingState`: everything one call's rounds read and change, built once (`api.run`).

A round is `speculative_round(state, γ)` (`engine.round`). The state holds the batch's slots (`engine.slots`: the
tokens and everything per slot, which change only through their own operations), the target's runner
(`engine.runner.Runner`), the drafter behind its guard, the token selector and random generator, the call's
settings, its statistics, the draft schedule, the head split (greedy verification with the head on demand: decided
here, once, from the runner the plan built) and the price of token trees. It keeps the invariants a round relies on:
every slot still generating ends at the slots' `length`; the target's cache holds columns [0, length − 1); a move of
the rows goes through the slots, the target's cache and the drafter in one call (`move_rows`); after each round a
queue refills the slots of rows that ended (`refill`, `engine.joins`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from assisted_backends.engine import joins
from assisted_backends.engine.acceptance import Verification
from assisted_backends.engine.drafter import Drafter, GuardedDrafter
from assisted_backends.engine.head_on_demand import HeadSplit
from assisted_backends.engine.outputs import CommittedScores
from assisted_backends.engine.realign import RowMove, plan_move
from assisted_backends.engine.runner import Runner
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.schedule import DraftSchedule, RoundObservation, TreePrice
from assisted_backends.engine.slots import Slots
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.stopping import StopCheck

if TYPE_CHECKING:  # a call without a prefix cache imports none of it
    from assisted_backends.engine.prefix_reuse import PrefixReuse


@dataclass
class LoopSettings:
    """What the call asks of every round (and of the loop: `synchronize`, `refill`)."""

    max_new_tokens: int
    eos_token_ids: torch.Tensor | None  # [E] or None
    static_shapes: bool  # always draft γ, always verify γ + 1
    synchronize: Callable[[], None]
    stop: StopCheck | None = None  # stop strings / custom criteria, checked on every candidate prefix
    on_commit: Callable[[list[int]], None] | None = None  # receives the committed tokens of each round
    record: CommittedScores | None = None  # keeps the logits behind each committed token
    refill: joins.Refill | None = None  # a queue of prompts taking the slots of rows that end (`engine.joins`)
    prefix: PrefixReuse | None = None  # earlier requests' prefixes reused, finished rows kept (`engine.prefix_reuse`)


@dataclass
class DecodingState:
    """One call's decoding state (see the module docstring); `DecodingState.build` makes it from its parts."""

    slots: Slots
    target: Runner
    drafter: GuardedDrafter
    selector: TokenSelector
    generator: torch.Generator | None
    settings: LoopSettings
    stats: GenerationStats
    schedule: DraftSchedule | None
    split: HeadSplit | None  # greedy with the target's head on demand (`engine.head_on_demand`), else None
    tree_price: TreePrice  # one row's rounds: chain or token tree by measured cost

    @classmethod
    def build(
        cls,
        target: Runner,
        drafter: Drafter | None,
        slots: Slots,
        selector: TokenSelector,
        generator: torch.Generator | None,
        settings: LoopSettings,
        stats: GenerationStats,
        schedule: DraftSchedule | None = None,
    ) -> DecodingState:
        """The state before the prompt pass: the slots opened (limits, statistics, the queue's finish hook); the head
        splits (greedy only) where the plan gave the runner a head on demand."""
        refill = settings.refill
        own_limits = refill.limits if refill is not None else {}
        slots.open(stats, settings.max_new_tokens, own_limits, _on_finish(refill, selector))
        split = HeadSplit(target.head) if target.head is not None and not selector.do_sample else None
        guarded = GuardedDrafter(drafter, slots)
        return cls(slots, target, guarded, selector, generator, settings, stats, schedule, split, TreePrice())

    @property
    def drop_finished(self) -> bool:
        """Finished rows leave the batch where the target's cache can shrink and shapes are free (the dynamic layout)
        rather than ride along (static shapes, where the batch size must not change)."""
        return not self.settings.static_shapes and self.target.resizable

    @property
    def reserve(self) -> int:
        """Finished rows that stay in the batch for a queue's next prompts to take their slots."""
        refill = self.settings.refill
        return refill.reserve() if refill is not None else 0

    def move_rows(self, move: RowMove, pad: list[int], length: int) -> None:
        """The one call that moves the rows (`engine.realign`): the slots (ids, column inputs, padding: the layouts
        read it, every per-slot list), then the target's cache and the drafter's state; rows end at `length`."""
        self.slots.move(move, pad, length)
        self.target.move_rows(move, self.slots.length - 1)
        self.drafter.move_rows(move)

    def settle(self, start: int, accepted: list[int], kept: dict[int, int], drafted: bool) -> bool:
        """After a round that began at column `start`: the shared length again, then the target's cache (and the
        drafter's, when it `drafted`) back to the committed tokens, the newest pending. One slot: start + what it
        kept. Several: the slots still generating realign to the most accepted (`engine.realign`). Returns
        whether rows left the batch."""
        slots, left = self.slots, False
        if not slots.batched:
            slots.end_round(start + kept[0])
        elif any(slots.generating):
            most = max(accepted[b] for b in slots.live())
            live_accepted = [accepted[b] if alive else 0 for b, alive in enumerate(slots.generating)]
            left = self.realign(live_accepted, start + most + 1)
        self.target.rollback(slots.length - 1)  # the newest committed token stays pending
        if drafted:
            self.drafter.rollback()
        return left

    def realign(self, accepted: list[int], length: int) -> bool:
        """Move the rows so that every slot still generating ends at one column (`engine.realign`), dropping the
        finished ones under the dynamic layout (but those a queue's next prompts take); `length`: the shared
        length if no row moved. Returns whether rows left the batch."""
        slots = self.slots
        began = time.perf_counter()
        refilled = set(slots.free(self.reserve))
        stays = [not self.drop_finished or b in refilled for b in range(slots.batch)]
        move, pad, cut = plan_move(slots.padding.host, accepted, slots.generating, stays, slots.ids.device)
        if move is None:
            slots.end_round(length)
            return False
        left = len(move.kept) < slots.batch
        self.move_rows(move, pad, length - cut)
        self.stats.record_move(time.perf_counter() - began)
        return left

    def refill(self) -> None:
        """Queues: the slots of rows that ended take the queue's next prompts (`engine.joins.refill`); nothing
        without a queue."""
        if self.settings.refill is not None:
            joins.refill(self)

    def record_round(
        self, verification: Verification, callers: list[int], accepted: list[int], timing: tuple[float, float],
        drafted: bool, batch: int,
    ) -> RoundObservation:  # fmt: skip
        """The one place a round's statistics are kept: each generating row's (by its caller index, `callers`) and
        the call's draft tokens verified and `accepted`, the head positions skipped, the price of a tree or chain
        pass of one row (`timing`: draft and verify seconds); returns what the schedule learns from the round."""
        for row, n in zip(callers, accepted):
            self.stats.record_round(verification.verified, n)
            self.slots.rows[row].record_round(verification.verified, n)
        self.stats.record_skipped(verification.skipped)
        self.tree_price.trees += verification.tree
        if drafted and not self.slots.batched:  # chain or tree: priced by the positions a pass feeds
            self.tree_price.observe(verification.fed, timing[1])
        row_accepted = tuple(accepted) if self.slots.batched else ()
        return RoundObservation(verification.scheduled, sum(accepted), timing[0], timing[1], row_accepted, batch)


def _on_finish(refill: joins.Refill | None, selector: TokenSelector) -> Callable[[int, torch.Tensor], None] | None:
    """Queues: a row that ended drops its processors and is handed to the caller's `on_finish`."""
    if refill is None:
        return None

    def finished(row: int, tokens: torch.Tensor) -> None:
        selector.drop_row(row)
        if refill.on_finish is not None:
            refill.on_finish(row, tokens)

    return finished

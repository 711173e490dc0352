"""`DecodingState`: everything one call's rounds read and change, built once (`api.run`), and its `LiveRows`.

A round is `speculative_round(state, γ)` (`engine.round`). The state holds the token buffer (which commits and
moves itself, `engine.tokens`), the target's runner (`engine.runner.Runner`), the drafter behind its guard, the
rows still generating, the token selector and random generator, the call's settings, its statistics, the draft
schedule, the head split (greedy verification with the head on demand: decided here, once, from the runner the
plan built) and the price of token trees. It keeps the invariants a round relies on: every row still generating
ends at the buffer's `length`; the target's cache holds columns [0, length − 1); a move of the rows goes through
the buffer, the target's cache and the drafter in one call (`move_rows`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from assisted_backends.engine.acceptance import Verification
from assisted_backends.engine.drafter import Drafter, GuardedDrafter
from assisted_backends.engine.head_on_demand import HeadSplit
from assisted_backends.engine.joins import Refill, free_slots
from assisted_backends.engine.outputs import CommittedScores
from assisted_backends.engine.realign import RowMove, plan_move
from assisted_backends.engine.runner import Runner
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.schedule import DraftSchedule, RoundObservation, TreePrice
from assisted_backends.engine.stats import GenerationStats, RowStats
from assisted_backends.engine.stopping import StopCheck
from assisted_backends.engine.tokens import TokenBuffer


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
    refill: Refill | None = None  # a queue of prompts taking the slots of rows that end (`engine.joins`)

    def limit(self, row: int) -> int:
        """The new-token limit of caller row `row`: a live queue's row may have its own (`Refill.limits`)."""
        return self.refill.limit(row, self.max_new_tokens) if self.refill is not None else self.max_new_tokens


class LiveRows:
    """Which slots of `buffer` still generate, and each caller row's stats. `on_finish(row, tokens)`:
    called with the caller's row index and its new tokens as each row ends. `drop_finished`: finished rows leave the
    batch (the dynamic layout) rather than ride along (static shapes, where the batch size must not change)."""

    def __init__(
        self,
        buffer: TokenBuffer,
        stats: GenerationStats,
        drop_finished: bool,
        on_finish: Callable[[int, torch.Tensor], None] | None = None,
    ) -> None:
        batch, filler_rows = buffer.ids.shape[0], buffer.filler_rows
        self.buffer = buffer
        self.generating = [True] * (batch - filler_rows) + [False] * filler_rows  # False: finished or filler, riding
        self.stats = [RowStats() for _ in range(batch - filler_rows)]  # by the caller's row index
        self.total = stats
        self.drop_finished = drop_finished
        self.on_finish = on_finish
        self.started = time.perf_counter()  # the call's start: rows' join and finish times count from it
        stats.batch_size, stats.rows = batch - filler_rows, self.stats

    def slots(self) -> list[int]:
        """The slots still generating."""
        return [b for b, alive in enumerate(self.generating) if alive]

    def join(self, slot: int, row: int, at: float) -> None:
        """The caller's row `row` (the next of a queue) takes `slot`, its prompt pass begun at `at`."""
        if row != len(self.stats):
            raise RuntimeError(f"queue rows join in order: expected row {len(self.stats)}, got {row}")
        self.stats.append(RowStats(joined_s=at))
        self.generating[slot] = True

    def commit(self, counts: dict[int, int], done: dict[int, bool], end: int) -> None:
        """Row b (its slot) committed counts[b] tokens ending before column end + counts[b]."""
        at = time.perf_counter() - self.started
        buffer = self.buffer
        buffer.commit(counts)
        for b in counts:
            row = self.stats[buffer.caller_rows[b]]
            row.new_tokens = buffer.new_tokens[b]
            if done[b]:
                self.generating[b] = False
                row.finished_s = at
                buffer.finish_row(b, end + counts[b])
                if self.on_finish is not None:
                    self.on_finish(buffer.caller_rows[b], buffer.results[buffer.caller_rows[b]])


@dataclass
class DecodingState:
    """One call's decoding state (see the module docstring); `DecodingState.build` makes it from its parts."""

    buffer: TokenBuffer
    target: Runner
    drafter: GuardedDrafter
    live: LiveRows
    selector: TokenSelector
    generator: torch.Generator | None
    settings: LoopSettings
    schedule: DraftSchedule | None
    split: HeadSplit | None  # greedy with the target's head on demand (`engine.head_on_demand`), else None
    tree_price: TreePrice  # one row's rounds: chain or token tree by measured cost

    @classmethod
    def build(
        cls,
        target: Runner,
        drafter: Drafter | None,
        buffer: TokenBuffer,
        selector: TokenSelector,
        generator: torch.Generator | None,
        settings: LoopSettings,
        stats: GenerationStats,
        schedule: DraftSchedule | None = None,
    ) -> DecodingState:
        """The state before the prompt pass. Finished rows leave the batch where the target's cache can shrink and
        shapes are free; the head splits (greedy only) where the plan gave the runner a head on demand."""
        drop_finished = not settings.static_shapes and target.resizable
        on_finish = _on_finish(settings.refill, selector)
        live = LiveRows(buffer, stats, drop_finished, on_finish)
        split = HeadSplit(target.head) if target.head is not None and not selector.do_sample else None
        guarded = GuardedDrafter(drafter, buffer)
        return cls(buffer, target, guarded, live, selector, generator, settings, schedule, split, TreePrice())

    @property
    def stats(self) -> GenerationStats:
        return self.live.total

    @property
    def reserve(self) -> int:
        """Finished rows that stay in the batch for a queue's next prompts to take their slots."""
        refill = self.settings.refill
        return refill.queue.pending() if refill is not None else 0

    def tokens_left(self) -> int:
        """The most new tokens a row still generating may yet commit."""
        buffer = self.buffer
        return max(self.settings.limit(buffer.caller_rows[b]) - buffer.new_tokens[b] for b in self.live.slots())

    def move_rows(self, move: RowMove, pad: list[int], length: int) -> None:
        """The one call that moves the rows (`engine.realign`): the buffer (ids, column inputs, padding: the
        layouts read it, `RowPadding`), then the target's cache and the drafter's state; rows end at `length`."""
        self.buffer.move_rows(move, pad, length)
        self.target.move_rows(move, self.buffer.length - 1)
        self.drafter.move_rows(move)

    def settle(self, start: int, accepted: list[int], kept: dict[int, int], drafted: bool) -> None:
        """After a round that began at column `start`: the shared length again, then the target's cache (and the
        drafter's, when it `drafted`) back to the committed tokens, the newest pending. One row: start + what it
        kept. Several: the rows still generating realign to the most accepted (`engine.realign`)."""
        buffer = self.buffer
        if not buffer.batched:
            buffer.end_round(start + kept[0])
        elif any(self.live.generating):
            most = max(accepted[b] for b in self.live.slots())
            live_accepted = [accepted[b] if alive else 0 for b, alive in enumerate(self.live.generating)]
            self.realign(live_accepted, start + most + 1)
        self.target.rollback(buffer.length - 1)  # the newest committed token stays pending
        if drafted:
            self.drafter.rollback()

    def realign(self, accepted: list[int], length: int) -> None:
        """Move the rows so that every one still generating ends at one column (`engine.realign`), dropping the
        finished ones under the dynamic layout (but those a queue's next prompts take); `length`: the shared
        length if no row moved."""
        live, buffer = self.live, self.buffer
        began = time.perf_counter()
        refilled = set(free_slots(live.generating, self.reserve))
        stays = [not live.drop_finished or b in refilled for b in range(len(live.generating))]
        move, pad, cut = plan_move(buffer.pad, accepted, live.generating, stays, buffer.ids.device)
        if move is None:
            buffer.end_round(length)
            return
        live.generating = [live.generating[b] for b in move.kept]
        self.move_rows(move, pad, length - cut)
        self.stats.row_moves += 1
        self.stats.move_s += time.perf_counter() - began

    def record_round(
        self, verification: Verification, callers: list[int], accepted: list[int], timing: tuple[float, float],
        drafted: bool, batch: int,
    ) -> RoundObservation:  # fmt: skip
        """The one place a round's statistics are kept: each generating row's (by its caller index, `callers`) and
        the call's draft tokens verified and `accepted`, the head positions skipped, the price of a tree or chain
        pass of one row (`timing`: draft and verify seconds); returns what the schedule learns from the round."""
        for row, n in zip(callers, accepted):
            self.stats.record_round(verification.verified, n)
            self.live.stats[row].record_round(verification.verified, n)
        self.stats.head_positions_skipped += verification.skipped
        self.tree_price.trees += verification.tree
        if drafted and not self.buffer.batched:  # chain or tree: priced by the rows a pass feeds
            self.tree_price.observe(verification.fed, timing[1])
        row_accepted = tuple(accepted) if self.buffer.batched else ()
        return RoundObservation(verification.scheduled, sum(accepted), timing[0], timing[1], row_accepted, batch)


def _on_finish(refill: Refill | None, selector: TokenSelector) -> Callable[[int, torch.Tensor], None] | None:
    """Queues: a row that ended drops its processors and is handed to the caller's `on_finish`."""
    if refill is None:
        return None

    def finished(row: int, tokens: torch.Tensor) -> None:
        selector.drop_row(row)
        if refill.on_finish is not None:
            refill.on_finish(row, tokens)
        refill.limits.pop(row, None)

    return finished

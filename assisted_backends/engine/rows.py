"""`LiveRows`: the host side of a batch, the collaborator a round commits to.

It knows which batch positions still generate (`live`: finished and filler rows ride along unread), each
caller row's statistics, and, after a round of several rows, brings them back to one shared length
(`settle`: the move of `engine.realign` through the buffer, the target's cache and the drafter). One row
needs none of that: its committed tokens stay in place and the length grows by what it kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from assisted_backends.engine.drafter import GuardedDrafter
from assisted_backends.engine.joins import free_slots
from assisted_backends.engine.realign import plan_move
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.stats import GenerationStats, RowStats
from assisted_backends.engine.tokens import TokenBuffer


class LiveRows:
    """Which batch positions still generate, and each caller row's stats. `on_finish(row, tokens)`: called with
    the caller's row index and its new tokens as each row ends. `drop_finished`: finished rows leave the batch
    (the dynamic layout) rather than ride along (static shapes, where the batch size must not change)."""

    def __init__(
        self,
        batch: int,
        filler_rows: int,
        stats: GenerationStats,
        drop_finished: bool,
        on_finish: Callable[[int, torch.Tensor], None] | None = None,
    ) -> None:
        self.live = [True] * (batch - filler_rows) + [False] * filler_rows  # False: finished or filler, riding along
        self.stats = [RowStats() for _ in range(batch - filler_rows)]  # by the caller's row index
        self.total = stats
        self.drop_finished = drop_finished
        self.on_finish = on_finish
        self.started = time.perf_counter()  # the call's start: rows' join and finish times count from it
        stats.batch_size, stats.rows = batch - filler_rows, self.stats

    def positions(self) -> list[int]:
        """The batch positions still generating."""
        return [b for b, alive in enumerate(self.live) if alive]

    def join(self, position: int, row: int, at: float) -> None:
        """The caller's row `row` (the next of a queue) takes batch `position`, its prompt pass begun at `at`."""
        if row != len(self.stats):
            raise RuntimeError(f"queue rows join in order: expected row {len(self.stats)}, got {row}")
        self.stats.append(RowStats(joined_s=at))
        self.live[position] = True

    def commit(self, buffer: TokenBuffer, counts: dict[int, int], done: dict[int, bool], end: int) -> None:
        """Row b (batch position) committed counts[b] tokens ending before column end + counts[b]."""
        at = time.perf_counter() - self.started
        for b, count in counts.items():
            buffer.new_tokens[b] += count
            row = self.stats[buffer.caller_rows[b]]
            row.new_tokens = buffer.new_tokens[b]
            if done[b]:
                self.live[b] = False
                row.finished_s = at
                buffer.finish_row(b, end + count)
                if self.on_finish is not None:
                    self.on_finish(buffer.caller_rows[b], buffer.results[buffer.caller_rows[b]])

    def record_round(self, buffer: TokenBuffer, positions: list[int], drafted: int, accepted: list[int]) -> None:
        """Count the round in the call's statistics and in each of its rows'."""
        for b in positions:
            self.total.record_round(drafted, accepted[b])
            self.stats[buffer.caller_rows[b]].record_round(drafted, accepted[b])

    def settle(
        self,
        buffer: TokenBuffer,
        target: ModelRunner,
        drafter: GuardedDrafter,
        start: int,
        accepted: list[int],
        kept: dict[int, int],
        reserve: int,
    ) -> None:
        """After a round that began at column `start`: the shared length again. One row: start + what it kept.
        Several: the rows still generating realign to the most accepted (`engine.realign`); `reserve`: finished
        rows that stay for a queue's next prompts to take their slots."""
        if not buffer.batched:
            buffer.length = start + kept[0]
        elif any(self.live):
            most = max(accepted[b] for b in self.positions())
            live_accepted = [accepted[b] if alive else 0 for b, alive in enumerate(self.live)]
            self.realign(buffer, target, drafter, live_accepted, start + most + 1, reserve)

    def realign(
        self,
        buffer: TokenBuffer,
        target: ModelRunner,
        drafter: GuardedDrafter,
        accepted: list[int],
        length: int,
        reserve: int = 0,
    ) -> None:
        """Move the rows so that every one still generating ends at one column (`engine.realign`), dropping the
        finished ones under the dynamic layout; `length`: the shared length if no row moved."""
        began = time.perf_counter()
        refilled = set(free_slots(self.live, reserve))
        stays = [not self.drop_finished or b in refilled for b in range(len(self.live))]
        move, pad, cut = plan_move(buffer.pad, accepted, self.live, stays, buffer.ids.device)
        buffer.length = length
        if move is None:
            return
        buffer.move_rows(move, pad, move.kept)
        self.live = [self.live[b] for b in move.kept]
        buffer.length = length - cut
        target.move_rows(move, buffer.pad_tensor(), buffer.length - 1)
        drafter.move_rows(move, buffer)
        self.total.row_moves += 1
        self.total.move_s += time.perf_counter() - began

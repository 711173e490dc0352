"""The assisted-decoding loop: prefill -> [draft γ -> verify γ+1 -> accept -> commit/rollback]*.

With no drafter (or γ = 0) the same loop is plain autoregressive decoding, so both modes are
measured through one code path. Two optional hooks (`LoopSettings`): `stop` (stop strings and custom
criteria, `engine.stopping`) flags the prefixes of a round where plain decoding would stop, on the
device; `on_commit` (streaming, one row) receives each round's committed tokens. Both ride the round's
one host transfer. Batches are the same loop: every tensor keeps its batch dimension, each row accepts
its own n_b and stops at its own EOS or token limit, and the rows are realigned after the round
(`engine.realign`). Queues (`refill`) are the same loop too: after a round, the slot of every row that
ended takes the next prompt (`engine.joins`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from assisted_backends.engine.drafter import Drafter, GuardedDrafter
from assisted_backends.engine.head_on_demand import HeadSplit
from assisted_backends.engine.joins import Refill, ends_at_once, free_slots, grow, make_room, prefill_row
from assisted_backends.engine.round import LoopSettings, choose_first, prefill, speculative_round
from assisted_backends.engine.rows import LiveRows
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.schedule import DraftSchedule
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.tokens import RowStarts, TokenBuffer


def decode(
    target: ModelRunner,
    drafter: Drafter | None,
    buffer: TokenBuffer,
    selector: TokenSelector,
    schedule: DraftSchedule | None,
    generator: torch.Generator | None,
    settings: LoopSettings,
    stats: GenerationStats,
) -> GenerationStats:
    """Generate into `buffer` until every row has max_new_tokens or its EOS; fill and return `stats`.

    The prompt pass (`engine.round.prefill`), then rounds (`engine.round.speculative_round`) of the length the
    schedule picks. Several rows: after each round the rows realign (`LiveRows.settle`). A queue
    (`settings.refill`): after the prefill and after every round, the slot of each row that ended takes the
    next prompt (`engine.joins`), until the queue is empty and every row has ended. A draft that raises
    is dropped with one warning (`DraftFailedWarning`) and the call goes on with plain rounds.
    """
    started = time.perf_counter()
    refill = settings.refill
    drop_finished = not settings.static_shapes and target.layout.name == "dynamic"
    rows = LiveRows(buffer.ids.shape[0], buffer.filler_rows, stats, drop_finished, _on_finish(refill, selector))
    guarded = GuardedDrafter(drafter)

    prefill(target, buffer, rows, selector, generator, settings)
    if drop_finished and any(rows.live) and not all(rows.live):  # rows done at once leave (static: they ride)
        rows.realign(buffer, target, guarded, [0] * len(rows.live), buffer.length, _reserve(refill))
    # greedy: the head on demand (`engine.head_on_demand`), once the prefill has checked it
    split = HeadSplit() if target.head_ready and not selector.do_sample and settings.record is None else None
    settings.synchronize()
    prefill_done = time.perf_counter()
    if schedule is not None:
        schedule.observe_prefill(prefill_done - started)
    if refill is not None:  # rows that ended at their first token: their slots take the next prompts
        _refill(buffer, rows, target, guarded, selector, generator, settings)

    while any(rows.live):
        if schedule is not None:
            schedule.observe_batch(buffer.ids.shape[0])  # the rows this round feeds: its costs depend on them
        gamma = schedule.draft_length() if (guarded.active and schedule is not None) else 0
        if not settings.static_shapes:  # never draft what cannot be committed
            left = max(settings.limit(buffer.caller_rows[b]) - buffer.new_tokens[b] for b in rows.positions())
            gamma = min(gamma, left - 1)
        observation = speculative_round(
            gamma, target, guarded, buffer, rows, selector, generator, settings, split, _reserve(refill)
        )
        if schedule is not None:
            schedule.update(observation)
        if refill is not None:
            _refill(buffer, rows, target, guarded, selector, generator, settings)

    settings.synchronize()
    finished_at = time.perf_counter()
    stats.new_tokens = sum(row.new_tokens for row in rows.stats)
    stats.prefill_s = prefill_done - started
    stats.decode_s = finished_at - prefill_done
    stats.target_forwards = target.forward_count
    stats.draft_forwards = guarded.forward_count
    return stats


def _reserve(refill: Refill | None) -> int:
    """Finished rows that stay in the batch for a queue's next prompts to take their slots."""
    return refill.queue.pending() if refill is not None else 0


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


def _refill(
    buffer: TokenBuffer,
    rows: LiveRows,
    target: ModelRunner,
    drafter: GuardedDrafter,
    selector: TokenSelector,
    generator: torch.Generator | None,
    settings: LoopSettings,
) -> None:
    """Queues (`engine.joins`): rows whose caller left end; the slot of every row that ended takes the next prompt,
    and the next again while the one that joined ends at its first token; a live queue's batch grows while prompts
    wait and no slot is free; then each generating row's new tokens go to `on_progress`."""
    refill, stats = settings.refill, rows.total

    def choose(logits: torch.Tensor, context: torch.Tensor, own: RowStarts) -> torch.Tensor:
        return choose_first(logits, context, selector, generator, own)[0]

    _end_cancelled(buffer, rows, refill.queue.cancelled())
    if refill.slots is not None and not settings.static_shapes and target.layout.name == "dynamic":
        wanted = refill.queue.pending() - len(free_slots(rows.live, refill.queue.pending()))
        extra = min(wanted, refill.slots - len(rows.live))
        if extra > 0:
            grow(buffer, target, extra, lambda move: drafter.move_rows(move, buffer))
            rows.live.extend([False] * extra)
    for position in free_slots(rows.live, refill.queue.pending()):
        while refill.queue.pending() and not rows.live[position]:
            began = time.perf_counter()
            arrival = refill.queue.take()
            if arrival.max_new_tokens is not None:
                refill.limits[arrival.index] = arrival.max_new_tokens
            length = arrival.prompt.shape[0]
            make_room(buffer, target, length, lambda move: drafter.move_rows(move, buffer))
            selector.add_row(arrival.index, arrival.processors)
            rows.join(position, arrival.index, began - rows.started)
            joined = prefill_row(buffer, target, refill, position, arrival, choose)
            limit = settings.limit(arrival.index)
            done = ends_at_once(joined, buffer, settings.eos_token_ids, settings.stop, limit)
            rows.commit(buffer, {position: 1}, {position: done}, buffer.length - 1)
            if done:
                selector.drop_row(arrival.index)
            else:
                drafter.insert_row(buffer, position, refill.width(length), refill.pad_id)
            stats.joins += 1
            stats.join_s += time.perf_counter() - began
    if refill.on_progress is not None:
        for position in rows.positions():
            count = buffer.new_tokens[position]
            refill.on_progress(buffer.caller_rows[position], buffer.row_tokens(position, buffer.length, count))
    if refill.on_round is not None:
        refill.on_round(stats)


def _end_cancelled(buffer: TokenBuffer, rows: LiveRows, cancelled: list[int]) -> None:
    """Live queues: the rows of callers who left end now, with what they committed (their slots free)."""
    if not cancelled:
        return
    ending = set(cancelled)
    for position in rows.positions():
        if buffer.caller_rows[position] in ending:
            rows.commit(buffer, {position: 0}, {position: True}, buffer.length)

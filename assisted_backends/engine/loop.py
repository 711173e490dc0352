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

import torch

from assisted_backends.engine.joins import ends_at_once, free_slots, grow, make_room, prefill_row
from assisted_backends.engine.round import choose_first, prefill, speculative_round
from assisted_backends.engine.state import DecodingState
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.tokens import RowStarts


def decode(state: DecodingState) -> GenerationStats:
    """Generate into the state's buffer until every row has max_new_tokens or its EOS; fill and return its stats.

    The prompt pass (`engine.round.prefill`), then rounds (`engine.round.speculative_round`) of the length the
    schedule picks. Several rows: after each round the rows realign (`DecodingState.settle`). A queue
    (`settings.refill`): after the prefill and after every round, the slot of each row that ended takes the
    next prompt (`engine.joins`), until the queue is empty and every row has ended. A draft that raises
    is dropped with one warning (`DraftFailedWarning`) and the call goes on with plain rounds.
    """
    started = time.perf_counter()
    buffer, live, settings, schedule, stats = state.buffer, state.live, state.settings, state.schedule, state.stats

    prefill(state)
    if live.drop_finished and any(live.generating) and not all(live.generating):  # done at once: leave (static: ride)
        state.realign([0] * len(live.generating), buffer.length)
    settings.synchronize()
    prefill_done = time.perf_counter()
    if schedule is not None:
        schedule.observe_prefill(prefill_done - started)
    if settings.refill is not None:  # rows that ended at their first token: their slots take the next prompts
        _refill(state)

    while any(live.generating):
        if schedule is not None:
            schedule.observe_batch(buffer.ids.shape[0])  # the rows this round feeds: its costs depend on them
        gamma = schedule.draft_length() if (state.drafter.active and schedule is not None) else 0
        if not settings.static_shapes:  # never draft what cannot be committed
            gamma = min(gamma, state.tokens_left() - 1)
        observation = speculative_round(state, gamma)
        if schedule is not None:
            schedule.update(observation)
        if settings.refill is not None:
            _refill(state)

    settings.synchronize()
    finished_at = time.perf_counter()
    stats.new_tokens = sum(row.new_tokens for row in live.stats)
    stats.prefill_s = prefill_done - started
    stats.decode_s = finished_at - prefill_done
    stats.target_forwards = state.target.forward_count
    stats.draft_forwards = state.drafter.forward_count
    return stats


def _refill(state: DecodingState) -> None:
    """Queues (`engine.joins`): rows whose caller left end; the slot of every row that ended takes the next prompt,
    and the next again while the one that joined ends at its first token; a live queue's batch grows while prompts
    wait and no slot is free; then each generating row's new tokens go to `on_progress`."""
    buffer, live, settings, selector = state.buffer, state.live, state.settings, state.selector
    refill, stats = settings.refill, state.stats

    def choose(logits: torch.Tensor, context: torch.Tensor, own: RowStarts) -> torch.Tensor:
        return choose_first(logits, context, selector, state.generator, own)[0]

    _end_cancelled(state, refill.queue.cancelled())
    if refill.slots is not None and live.drop_finished:
        wanted = refill.queue.pending() - len(free_slots(live.generating, refill.queue.pending()))
        extra = min(wanted, refill.slots - len(live.generating))
        if extra > 0:
            grow(buffer, extra, state.move_rows)
            live.generating.extend([False] * extra)
    for slot in free_slots(live.generating, refill.queue.pending()):
        while refill.queue.pending() and not live.generating[slot]:
            began = time.perf_counter()
            arrival = refill.queue.take()
            if arrival.max_new_tokens is not None:
                refill.limits[arrival.index] = arrival.max_new_tokens
            length = arrival.prompt.shape[0]
            make_room(buffer, length, state.move_rows)
            selector.add_row(arrival.index, arrival.processors)
            live.join(slot, arrival.index, began - live.started)
            joined = prefill_row(buffer, state.target, refill, slot, arrival, choose)
            limit = settings.limit(arrival.index)
            done = ends_at_once(joined, buffer, settings.eos_token_ids, settings.stop, limit)
            live.commit({slot: 1}, {slot: done}, buffer.length - 1)
            if done:
                selector.drop_row(arrival.index)
            else:
                state.drafter.insert_row(slot, refill.width(length), refill.pad_id)
            stats.joins += 1
            stats.join_s += time.perf_counter() - began
    if refill.on_progress is not None:
        for slot in live.slots():
            count = buffer.new_tokens[slot]
            refill.on_progress(buffer.caller_rows[slot], buffer.row_tokens(slot, buffer.length, count))
    if refill.on_round is not None:
        refill.on_round(stats)


def _end_cancelled(state: DecodingState, cancelled: list[int]) -> None:
    """Live queues: the rows of callers who left end now, with what they committed (their slots free)."""
    if not cancelled:
        return
    ending, buffer = set(cancelled), state.buffer
    for slot in state.live.slots():
        if buffer.caller_rows[slot] in ending:
            state.live.commit({slot: 0}, {slot: True}, buffer.length)

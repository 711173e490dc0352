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

from assisted_backends.engine.round import prefill, speculative_round
from assisted_backends.engine.state import DecodingState
from assisted_backends.engine.stats import GenerationStats


def decode(state: DecodingState) -> GenerationStats:
    """Generate into the state's slots until every row has max_new_tokens or its EOS; fill and return its stats.

    The prompt pass (`engine.round.prefill`), then rounds (`engine.round.speculative_round`) of the length the
    schedule picks. Several rows: after each round the rows realign (`DecodingState.settle`). A queue
    (`settings.refill`): after the prefill and after every round, the slot of each row that ended takes the
    next prompt (`DecodingState.refill`, `engine.joins`), until the queue is empty and every row has ended. A draft
    that raises is dropped with one warning (`DraftFailedWarning`) and the call goes on with plain rounds.
    """
    started = time.perf_counter()
    slots, settings, schedule = state.slots, state.settings, state.schedule

    prefill(state)
    if state.drop_finished and any(slots.generating) and not all(slots.generating):  # done at once: leave
        state.realign([0] * slots.batch, slots.length)  # (static shapes: they ride along)
    settings.synchronize()
    prefill_done = time.perf_counter()
    if schedule is not None:
        schedule.observe_prefill(prefill_done - started)
    state.refill()  # rows that ended at their first token: their slots take the next prompts

    while any(slots.generating):
        if schedule is not None:
            schedule.observe_batch(slots.batch)  # the rows this round feeds: its costs depend on them
        gamma = schedule.draft_length() if (state.drafter.active and schedule is not None) else 0
        if not settings.static_shapes:  # never draft what cannot be committed
            gamma = min(gamma, slots.tokens_left() - 1)
        observation = speculative_round(state, gamma)
        if schedule is not None:
            schedule.update(observation)
        state.refill()

    settings.synchronize()
    new_tokens = sum(row.new_tokens for row in slots.rows)
    decode_s = time.perf_counter() - prefill_done
    forwards = (state.target.forward_count, state.drafter.forward_count)
    state.stats.record_totals(new_tokens, prefill_done - started, decode_s, *forwards)
    return state.stats

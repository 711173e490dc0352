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
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import torch

from assisted_backends.engine.acceptance import greedy_accept, speculative_accept
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.head_on_demand import HeadSplit, greedy_accept_on_demand
from assisted_backends.engine.joins import Refill, ends_at_once, free_slots, make_room, prefill_row
from assisted_backends.engine.outputs import CommittedScores
from assisted_backends.engine.realign import plan_move
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector, sample
from assisted_backends.engine.schedule import DraftSchedule, RoundObservation
from assisted_backends.engine.stats import GenerationStats, RowStats
from assisted_backends.engine.stopping import StopCheck
from assisted_backends.engine.tokens import RowStarts, TokenBuffer

P = ParamSpec("P")
T = TypeVar("T")


class DraftFailedWarning(RuntimeWarning):
    """The draft raised: the call goes on with plain decoding (the tokens are the target's either way)."""


@dataclass
class LoopSettings:
    max_new_tokens: int
    eos_token_ids: torch.Tensor | None  # [E] or None
    static_shapes: bool  # always draft γ, always verify γ + 1
    synchronize: Callable[[], None]
    stop: StopCheck | None = None  # stop strings / custom criteria, checked on every candidate prefix
    on_commit: Callable[[list[int]], None] | None = None  # receives the committed tokens of each round
    record: CommittedScores | None = None  # keeps the logits behind each committed token
    refill: Refill | None = None  # a queue of prompts taking the slots of rows that end (`engine.joins`)


def _choose_first(
    logits: torch.Tensor, context: torch.Tensor, selector: TokenSelector, generator, rows: RowStarts | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the first new token [B], its processed scores [B, 1, V])."""
    scores = selector.scores(logits, context, rows)
    if selector.do_sample:
        return sample(torch.softmax(scores, dim=-1), generator)[:, -1], scores
    return scores.argmax(dim=-1)[:, -1], scores


def _verify(
    target: ModelRunner,
    buffer: TokenBuffer,
    start: int,
    draft: torch.Tensor,
    proposal: Proposal,
    selector: TokenSelector,
    generator: torch.Generator | None,
    split: HeadSplit | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One target pass over the pending token and the γ draft tokens: (n [B], next token [B], logits [B, m, V],
    processed scores [B, m, V] or None).

    m = γ + 1, except when the head runs on demand (greedy, `split` given and wanting it): then the
    logits of position 1 come first and the rest only if some row accepted x_1 (`engine.head_on_demand`),
    and no scores are returned.
    """
    gamma = draft.shape[1]
    tokens = buffer.ids[:, target.length : start + gamma]  # [B, γ+1]
    rows = buffer.row_starts()
    if split is not None and gamma > 0 and split.wanted():
        hidden = target.forward(tokens, hidden_only=True)  # [B, γ+1, D]

        def choose(logits: torch.Tensor, end: int) -> torch.Tensor:
            return selector.greedy(logits, buffer.through(start + end - 1), rows)

        return *greedy_accept_on_demand(draft, hidden, target.head, choose, split), None
    logits = target.forward(tokens)  # [B, γ+1, V]
    scores = selector.scores(logits, buffer.through(start + gamma), rows)  # [B, γ+1, V]
    if not selector.do_sample:
        accepted, next_token = greedy_accept(draft, scores.argmax(dim=-1))
        if split is not None and gamma > 0:
            split.record_outcome(bool((accepted > 0).any()))
        return accepted, next_token, logits, scores
    p = torch.softmax(scores, dim=-1)  # [B, γ+1, V]
    if gamma > 0:
        accepted, next_token = speculative_accept(draft, proposal.q, p, generator)
        return accepted, next_token, logits, scores
    return torch.zeros(p.shape[0], dtype=torch.long, device=p.device), sample(p[:, -1], generator), logits, scores


def _round_outcome(
    accepted: torch.Tensor,
    span: torch.Tensor,
    eos_token_ids: torch.Tensor | None,
    stops: torch.Tensor | None,
    with_tokens: bool,
) -> tuple[list[int], list[int], list[int]]:
    """(n, e, tokens): per row the accepted count and the index in `span` [B, m] of the first EOS or stop
    among its n + 1 new tokens (m when there is none) and, when asked, row 0's span tokens, read from the
    device in one transfer: the round's only host sync. `stops` [B, m]: where a stopping criterion fires."""
    batch, m = span.shape
    if eos_token_ids is None and stops is None and not with_tokens:
        return accepted.tolist(), [m] * batch, []
    positions = torch.arange(m, device=span.device)
    hits = torch.zeros_like(span, dtype=torch.bool)  # [B, m]
    if eos_token_ids is not None:
        hits = hits | torch.isin(span, eos_token_ids)
    if stops is not None:
        hits = hits | stops
    hits = hits & (positions[None, :] <= accepted[:, None])
    first = torch.where(hits.any(dim=1), hits.long().argmax(dim=1), m)  # [B]
    parts = [accepted, first] + ([span[0]] if with_tokens else [])
    values = torch.cat(parts).tolist()
    return values[:batch], values[batch : 2 * batch], values[2 * batch :]


class LiveRows:
    """The host side of a batch: which batch positions still generate, and each caller row's stats.
    `on_finish(row, tokens)`: called with the caller's row index and its new tokens as each row ends."""

    def __init__(
        self,
        batch: int,
        filler_rows: int,
        stats: GenerationStats,
        on_finish: Callable[[int, torch.Tensor], None] | None = None,
    ) -> None:
        self.live = [True] * (batch - filler_rows) + [False] * filler_rows  # False: finished or filler, riding along
        self.stats = [RowStats() for _ in range(batch - filler_rows)]  # by the caller's row index
        self.total = stats
        self.on_finish = on_finish
        stats.batch_size, stats.rows = batch - filler_rows, self.stats

    def join(self, position: int, row: int, at: float) -> None:
        """The caller's row `row` (the next of a queue) takes batch `position`, its prompt pass begun at `at`."""
        if row != len(self.stats):
            raise RuntimeError(f"queue rows join in order: expected row {len(self.stats)}, got {row}")
        self.stats.append(RowStats(joined_s=at))
        self.live[position] = True

    def commit(self, buffer: TokenBuffer, counts: dict[int, int], done: dict[int, bool], end: int, at: float) -> None:
        """Row b (batch position) committed counts[b] tokens ending before column end + counts[b]."""
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


def _on_finish(refill: Refill | None, selector: TokenSelector) -> Callable[[int, torch.Tensor], None] | None:
    """Queues: a row that ended drops its processors and is handed to the caller's `on_finish`."""
    if refill is None:
        return None

    def finished(row: int, tokens: torch.Tensor) -> None:
        selector.drop_row(row)
        if refill.on_finish is not None:
            refill.on_finish(row, tokens)

    return finished


def _record(settings: LoopSettings, buffer: TokenBuffer, counts: dict[int, int], logits, scores) -> None:
    """Keep the logits behind the tokens each row just committed (when the caller asked for them)."""
    if settings.record is not None:
        for b, count in counts.items():
            settings.record.add(buffer.caller_rows[b], logits[b], scores[b], count)


def _guarded(drafter: Drafter, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> tuple[bool, T | None]:
    """`method(*args)`, one method of `drafter`, as (True, its result); if the draft raises, one warning and
    (False, None): the loop goes on without it."""
    try:
        return True, method(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - any failure of the draft: the target alone still serves the call
        drafter.stopped = f"the draft raised {type(error).__name__}: {error}"
        warnings.warn(f"{drafter.name}: {drafter.stopped}; plain decoding from here on", DraftFailedWarning, 3)
        return False, None


def _note_stop(drafter: Drafter | None, buffer: TokenBuffer, stats: GenerationStats) -> None:
    """Record when and why drafting stopped for the rest of the call (once)."""
    if drafter is not None and drafter.stopped is not None and stats.drafting_stopped is None:
        stats.drafting_stopped = drafter.stopped
        stats.drafting_stopped_at = sum(buffer.new_tokens)


def _move_rows(
    buffer: TokenBuffer,
    rows: LiveRows,
    accepted: list[int],
    length: int,
    drop_finished: bool,
    target: ModelRunner,
    drafter: Drafter | None,
    reserve: int = 0,
) -> tuple[int, bool]:
    """Batches: realign the rows after a round (`engine.realign`); return the shared length afterwards and
    whether the drafter followed (False: it raised, the call goes on without it).

    `length`: the shared length if no row moved (the round's start + max accepted + 1); `reserve`: finished
    rows that stay for a queue's next prompts to take their slots (the first ones), where they would leave."""
    began = time.perf_counter()
    refilled = set(free_slots(rows.live, reserve))
    stays = [not drop_finished or b in refilled for b in range(len(rows.live))]
    move, pad, cut = plan_move(buffer.pad, accepted, rows.live, stays, buffer.ids.device)
    if move is None:
        return length, True
    buffer.move_rows(move, pad, move.kept)
    rows.live = [rows.live[b] for b in move.kept]
    buffer.length = length - cut
    target.move_rows(move, buffer.pad_tensor(), buffer.length - 1)
    followed = drafter is None or _guarded(drafter, drafter.move_rows, move, buffer)[0]
    rows.total.row_moves += 1
    rows.total.move_s += time.perf_counter() - began
    return buffer.length, followed


def _refill(
    buffer: TokenBuffer,
    rows: LiveRows,
    target: ModelRunner,
    drafter: Drafter | None,
    selector: TokenSelector,
    generator: torch.Generator | None,
    settings: LoopSettings,
    started: float,
) -> Drafter | None:
    """Queues (`engine.joins`): the slot of every row that ended takes the next prompt, and the next again while
    the one that joined ends at its first token; return the drafter (None once it raised: plain rounds)."""
    refill, stats = settings.refill, rows.total

    def choose(logits: torch.Tensor, context: torch.Tensor, own: RowStarts) -> torch.Tensor:
        return _choose_first(logits, context, selector, generator, own)[0]

    def move_drafter(move) -> None:
        nonlocal drafter
        if drafter is not None and not _guarded(drafter, drafter.move_rows, move, buffer)[0]:
            drafter = None

    for position in free_slots(rows.live, refill.queue.pending()):
        while refill.queue.pending() and not rows.live[position]:
            began = time.perf_counter()
            arrival = refill.queue.take()
            length = arrival.prompt.shape[0]
            make_room(buffer, target, length, move_drafter)
            selector.add_row(arrival.index, arrival.processors)
            rows.join(position, arrival.index, began - started)
            joined = prefill_row(buffer, target, refill, position, arrival, choose)
            done = ends_at_once(joined, buffer, settings.eos_token_ids, settings.stop, settings.max_new_tokens)
            rows.commit(buffer, {position: 1}, {position: done}, buffer.length - 1, time.perf_counter() - started)
            if done:
                selector.drop_row(arrival.index)
            elif drafter is not None:
                args = (buffer, position, refill.width(length), refill.pad_id)
                drafter = drafter if _guarded(drafter, drafter.insert_row, *args)[0] else None
            stats.joins += 1
            stats.join_s += time.perf_counter() - began
    return drafter


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

    One row: the committed tokens stay in place. Several rows (`engine.realign`): after each round the rows
    move so that all end at one column again; finished rows leave the batch under the dynamic layout
    and ride along (unread) under static shapes, where the batch size must not change. A queue
    (`settings.refill`): after the prefill and after every round, the slot of each row that ended takes the
    next prompt (`engine.joins`), until the queue is empty and every row has ended. A draft that raises
    is dropped with one warning (`DraftFailedWarning`) and the call goes on with plain rounds.
    """
    started = time.perf_counter()
    refill = settings.refill
    rows = LiveRows(buffer.ids.shape[0], buffer.filler_rows, stats, _on_finish(refill, selector))
    drop_finished = not settings.static_shapes and target.layout.name == "dynamic"
    split = None  # greedy with the head on demand (`engine.head_on_demand`): decided after the prefill checked it
    full = drafter  # kept for the statistics when a failing draft is dropped

    # Prefill: the target sees the prompt and picks the first token. The drafter sees the committed
    # tokens only when it is first asked to draft, so a schedule that never speculates never pays for it.
    logits = target.forward(buffer.committed(), last_only=True)
    first, scores = _choose_first(logits, buffer.committed(), selector, generator, buffer.row_starts())
    draft_ready = False
    buffer.ids[:, buffer.length] = first
    stops = None
    if settings.stop is not None:
        stops = settings.stop.hits(buffer.ids, buffer.length, 1, logits[:, -1:], buffer.row_starts())
    _, ends, tokens = _round_outcome(
        torch.zeros_like(first), buffer.ids[:, buffer.length : buffer.length + 1], settings.eos_token_ids, stops,
        settings.on_commit is not None,
    )  # fmt: skip
    batch = len(ends)
    live = [b for b, alive in enumerate(rows.live) if alive]
    done = {b: ends[b] == 0 or settings.max_new_tokens == 1 for b in live}
    _record(settings, buffer, dict.fromkeys(live, 1), logits[:, -1:], scores)
    rows.commit(buffer, dict.fromkeys(live, 1), done, buffer.length, time.perf_counter() - started)
    buffer.length += 1
    if settings.on_commit is not None:
        settings.on_commit(tokens)
    if drop_finished and any(rows.live) and not all(rows.live):  # rows done at once leave (static: they ride)
        reserve = refill.queue.pending() if refill is not None else 0
        _, followed = _move_rows(buffer, rows, [0] * batch, buffer.length, drop_finished, target, drafter, reserve)
        drafter = drafter if followed else None
    if target.head_ready and not selector.do_sample and settings.record is None:
        split = HeadSplit()
    settings.synchronize()
    prefill_done = time.perf_counter()
    if schedule is not None:
        schedule.observe_prefill(prefill_done - started)
    if refill is not None:  # rows that ended at their first token: their slots take the next prompts
        drafter = _refill(buffer, rows, target, drafter, selector, generator, settings, started)

    while any(rows.live):
        live = [b for b, alive in enumerate(rows.live) if alive]
        remaining = {b: settings.max_new_tokens - buffer.new_tokens[b] for b in live}
        if schedule is not None:
            schedule.observe_batch(buffer.ids.shape[0])  # the rows this round feeds: its costs depend on them
        gamma = schedule.draft_length() if (drafter is not None and schedule is not None) else 0
        if not settings.static_shapes:
            gamma = min(gamma, max(remaining.values()) - 1)  # never draft what cannot be committed
        start = buffer.length

        if gamma > 0 and not draft_ready:
            draft_ready = True
            if not _guarded(drafter, drafter.prefill, buffer)[0]:
                drafter, gamma = None, 0
        round_started = time.perf_counter()
        proposal = Proposal(0)
        if gamma > 0:
            proposed, outcome = _guarded(drafter, drafter.propose, buffer, gamma, selector, generator)
            proposal, drafter = (outcome, drafter) if proposed else (Proposal(0), None)
        _note_stop(full, buffer, stats)
        if settings.static_shapes and drafter is not None and proposal.count != gamma:
            raise RuntimeError(f"{drafter.name} proposed {proposal.count} tokens; static shapes need exactly {gamma}")
        asked, gamma = gamma, proposal.count
        draft = buffer.ids[:, start : start + gamma]  # [B, γ]
        drafted_at = time.perf_counter()
        accepted, next_token, logits, scores = _verify(
            target, buffer, start, draft, proposal, selector, generator, split
        )
        stats.head_positions_skipped += gamma + 1 - logits.shape[1]

        span = buffer.ids[:, start : start + gamma + 1]  # [B, γ+1]: the draft, then scratch
        span.scatter_(1, accepted[:, None], next_token[:, None])  # the target's token after the n accepted
        stops = None
        if settings.stop is not None:  # positions past the computed logits lie past n: never committed
            stops = settings.stop.hits(buffer.ids, start, logits.shape[1], logits, buffer.row_starts())
            stops = torch.nn.functional.pad(stops, (0, gamma + 1 - logits.shape[1]), value=False)
        n, ends, tokens = _round_outcome(accepted, span, settings.eos_token_ids, stops, settings.on_commit is not None)
        verified_at = time.perf_counter()
        keep = {b: min(n[b] + 1, remaining[b], ends[b] + 1) for b in live}  # to the limit and the first EOS/stop
        done = {b: ends[b] < keep[b] or keep[b] == remaining[b] for b in live}
        _record(settings, buffer, keep, logits, scores)
        rows.commit(buffer, keep, done, start, verified_at - started)
        if settings.on_commit is not None:
            settings.on_commit(tokens[: keep[0]])  # committed tokens only: never a rejected draft token
        for b in live:
            stats.record_round(gamma, n[b])
            rows.stats[buffer.caller_rows[b]].record_round(gamma, n[b])

        if not buffer.batched:
            buffer.length = start + keep[0]
        elif any(rows.live):
            most = max(n[b] for b in live if rows.live[b])
            n_live = [n[b] if rows.live[b] else 0 for b in range(len(rows.live))]
            length = start + most + 1
            reserve = refill.queue.pending() if refill is not None else 0
            buffer.length, followed = _move_rows(buffer, rows, n_live, length, drop_finished, target, drafter, reserve)
            drafter = drafter if followed else None
        target.rollback(buffer.length - 1)  # the newest committed token stays pending
        if drafter is not None and asked > 0 and not _guarded(drafter, drafter.rollback, buffer)[0]:
            drafter = None
        _note_stop(full, buffer, stats)
        if schedule is not None:  # batches: the verify cost includes realigning the rows (it grows with γ too)
            row_accepted = tuple(n[b] for b in live) if buffer.batched else ()
            verify_s = (time.perf_counter() if buffer.batched else verified_at) - drafted_at
            schedule.update(
                RoundObservation(
                    gamma, sum(n[b] for b in live), drafted_at - round_started, verify_s, row_accepted, len(n)
                )
            )
        if refill is not None:
            drafter = _refill(buffer, rows, target, drafter, selector, generator, settings, started)

    settings.synchronize()
    finished_at = time.perf_counter()
    stats.new_tokens = sum(row.new_tokens for row in rows.stats)
    stats.prefill_s = prefill_done - started
    stats.decode_s = finished_at - prefill_done
    stats.target_forwards = target.forward_count
    stats.draft_forwards = full.forward_count if full is not None else 0
    return stats

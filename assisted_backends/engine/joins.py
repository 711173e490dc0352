"""Many prompts through a fixed number of slots: a finished row's slot takes the next prompt of a queue.

Design (docs/design.md "Many prompts through a fixed number of slots"). The batch keeps the layout of
`engine.realign`: left padding, then each row's tokens, every row ending at the shared column L, the
newest committed token (column L − 1) pending for the target, whose cache holds columns [0, L − 1). A
prompt x of P tokens joins at slot b, left by a row that ended, as if it had always been
there with L − 1 − P columns of padding:

1. room: if P + 1 > L every row moves right by P + 1 − L (`realign.widen`: one `RowMove` through the
   slots, the target's cache and the drafter, the machinery rows already move with); L = P + 1;
2. tokens: columns [L − 1 − P, L − 1) of row b take x, the padding before them the pad id;
3. prefill: one pass of the target over x alone (`ModelRunner.insert_row`: a one-row cache of the same
   layout kind, left-padded to the prompt's bucket under static shapes), whose P positions' keys and
   values are written into row b of the target's cache at the same columns; position ids are column
   minus padding, so the keys carry the positions `model.generate` gives x alone;
4. first token: chosen from that pass's last logits by the row's own processors (built for x alone),
   as the prefill of `model.generate` chooses it; it sits at column L − 1, pending like every row's
   newest token. EOS, a stop string or max_new_tokens = 1 end the row at once, and the slot takes the next prompt;
5. the drafter follows (`Drafter.insert_row`, which every drafter implements): a draft model writes what its cache
   holds of the row (its own one-row pass; the rest is fed as pending tokens in its next catch-up), an early-exit
   view copies its layers from the target's cache, an EAGLE head runs over the row's features (the target's
   one-row pass handed them over), a draft of another tokenizer gets a fresh per-row state, suffix decoding a fresh
   index of the row, prompt lookup keeps none.

`refill(state)` is what the loop calls after the prefill and after every round (`DecodingState.refill`); the slots
change only through their own operations (`Slots.join`, `place_first`, `commit`, `finish`, `move`). The loop
(`engine.loop.decode`) then goes on with the same rounds: nothing else knows that a row is new.

A live queue (a server's requests, `api.queue.generate_live`) is the same queue fed while the loop runs: its
`pending()` counts what has arrived by the time the loop asks (after the prefill and after every round), a
row may carry its own token limit (`Arrival.max_new_tokens`), `cancelled()` names rows whose caller left (each
ends before the next round, its slot free), `on_progress` hands every generating row's new tokens to the
caller after each round, and when prompts wait and no slot is free the batch grows by rows, up to
`Refill.slots` (the dynamic layout; a static batch keeps its bucket).
Which row joins when is a function of the committed tokens (the order of the queue, the rows that
ended), so every rank of a multi-rank launch joins the same prompts at the same round (rule 9).

Shapes: the joining pass feeds [1, P] under the dynamic layout; under static shapes [1, Pb] (Pb the
prompt's bucket) on a [1, Pb] cache: one more signature per prompt bucket, and the batch keeps its
bucket B' (the slot count), so the verify [B', γ + 1] and draft [B', 1..2] signatures do not change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers.generation.logits_process import LogitsProcessor

from assisted_backends.engine.drafter import GuardedDrafter
from assisted_backends.engine.kv_cache import bucketed
from assisted_backends.engine.realign import RowMove, widen
from assisted_backends.engine.row_pass import RowPass
from assisted_backends.engine.runner import Runner
from assisted_backends.engine.sampling import TokenSelector, sample
from assisted_backends.engine.slots import RowStarts, Slots
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.stopping import StopCheck

MoveRows = Callable[[RowMove, list[int], int], None]  # (move, the rows' new padding, their shared length after)


@dataclass(frozen=True)
class Arrival:
    """A prompt taking a slot: `index` its position in the caller's queue (its caller row), `prompt` [P] its
    token ids, `processors` the logits processors `model.generate` builds for that prompt alone."""

    index: int
    prompt: torch.Tensor
    processors: list[LogitsProcessor]
    max_new_tokens: int | None = None  # the row's own limit (None: the call's)


@dataclass
class Taken:
    """An arrival taken from the queue with its own pass (`engine.row_pass`): begun at `began`, computed for
    `seconds` so far; `cancelled` once its caller left while it was computed (it joins and ends at once, so that
    rows keep joining in order)."""

    arrival: Arrival
    pass_: RowPass
    began: float
    seconds: float = 0.0
    cancelled: bool = False

    def feed(self, chunk: int | None) -> None:
        """The next `chunk` columns of the pass (None: the rest; nothing once it is computed)."""
        if self.pass_.logits is not None:
            return
        began = time.perf_counter()
        self.pass_.feed(chunk)
        self.seconds += time.perf_counter() - began


class PromptQueue:
    """The prompts still waiting for a slot, taken in order (`arrivals` yields them, built lazily)."""

    def __init__(self, arrivals: Iterator[Arrival], waiting: int) -> None:
        self._arrivals = arrivals
        self.waiting = waiting

    def pending(self) -> int:
        return self.waiting

    def take(self) -> Arrival:
        self.waiting -= 1
        return next(self._arrivals)

    def cancelled(self) -> list[int]:
        """Caller rows to end now, before the next round (a live queue's clients that left); none here."""
        return []


@dataclass
class Refill:
    """What the loop needs to refill slots: the queue, the pad id, the prompt bucket under static shapes (None:
    dynamic), and `on_finish(index, tokens)`, called with each row's new tokens as it ends."""

    queue: PromptQueue
    pad_id: int
    bucket: int | None = None
    on_finish: Callable[[int, torch.Tensor], None] | None = None
    slots: int | None = None  # live queues: rows the batch may grow to when prompts wait (None: it never grows)
    on_progress: Callable[[int, torch.Tensor], None] | None = None  # live queues: a row's new tokens so far
    limits: dict[int, int] = field(default_factory=dict)  # the first rows' own max_new_tokens, by caller row
    on_round: Callable[[GenerationStats], None] | None = None  # live queues: the call's statistics after each round
    chunk: int | None = None  # columns of a joining prompt's pass per round while rows generate (None: whole)
    prefilling: Taken | None = None  # the prompt whose pass goes on between rounds (no slot is kept for it meanwhile)

    def reserve(self) -> int:
        """Finished rows to keep for the next prompts: as many as wait (none while a prompt's pass goes on)."""
        return 0 if self.prefilling is not None else self.queue.pending()

    def width(self, prompt_length: int) -> int:
        """Columns of a joining prompt's own pass: its bucket under static shapes, else its length."""
        return bucketed(prompt_length, self.bucket) if self.bucket else prompt_length


class JoinSettings(Protocol):
    """What a refill reads of the call's settings (`engine.state.LoopSettings`)."""

    max_new_tokens: int
    eos_token_ids: torch.Tensor | None
    stop: StopCheck | None
    refill: Refill | None


class QueueState(Protocol):
    """What a refill reads and changes of the decoding state (`engine.state.DecodingState`, which calls `refill`:
    typed here by what it offers, so that neither module imports the other)."""

    slots: Slots
    target: Runner
    drafter: GuardedDrafter
    selector: TokenSelector
    generator: torch.Generator | None
    settings: JoinSettings
    stats: GenerationStats

    @property
    def drop_finished(self) -> bool: ...

    def move_rows(self, move: RowMove, pad: list[int], length: int) -> None: ...


@dataclass(frozen=True)
class Joined:
    """A row that joined at `slot`: its first token and whether that token already ended it."""

    slot: int
    index: int
    first: torch.Tensor  # [1] the first new token
    logits: torch.Tensor  # [1, 1, V] the prompt pass's last logits
    scores: torch.Tensor  # [1, 1, V] the processed scores the first token was chosen from
    pad: int


def refill(state: QueueState) -> None:
    """Rows whose caller left end; the slot of every row that ended takes the next prompt, and the next again while
    the one that joined ends at its first token; a live queue's batch grows while prompts wait and no slot is free;
    a long prompt joining running rows is computed a chunk per call (`Refill.chunk`), the prompts after it waiting
    behind it; then each generating row's new tokens go to `on_progress`, and the statistics to `on_round`."""
    slots, hooks = state.slots, state.settings.refill
    queue = hooks.queue
    cancelled = queue.cancelled()
    end_cancelled(slots, cancelled)
    if hooks.prefilling is not None:
        hooks.prefilling.cancelled |= hooks.prefilling.arrival.index in cancelled
        hooks.prefilling.feed(hooks.chunk if any(slots.generating) else None)
    grow_for_waiting(state)
    while True:
        free = slots.free(1)
        if hooks.prefilling is not None:  # later arrivals wait behind it
            if hooks.prefilling.pass_.logits is None:  # its pass goes on after the next round
                break
            if not free:  # no slot was kept for it while it was computed: one more row
                grow(slots, 1, state.move_rows)
                free = slots.free(1)
            taken, hooks.prefilling = hooks.prefilling, None
        elif free and queue.pending():
            taken = take(state, queue.take())
            if taken is hooks.prefilling:  # its pass goes on after the next round
                break
        else:
            break
        join(state, free[0], taken)
    if hooks.on_progress is not None:
        for slot in slots.live():
            count = slots.new_tokens[slot]
            hooks.on_progress(slots.caller_rows[slot], slots.row_tokens(slot, slots.length, count))
    if hooks.on_round is not None:
        hooks.on_round(state.stats)


def take(state: QueueState, arrival: Arrival) -> Taken:
    """`arrival` taken from the queue with its pass: computed whole as it joins (`ModelRunner.insert_row`), or, where
    a pass may be chunked and rows generate, its first chunk now and the rest after the next rounds while longer
    (`Refill.prefilling`)."""
    refill = state.settings.refill
    length = arrival.prompt.shape[0]
    prompt = arrival.prompt.to(state.slots.ids.device)
    taken = Taken(arrival, state.target.row_pass(prompt, refill.width(length), refill.pad_id), time.perf_counter())
    if refill.chunk is not None and taken.pass_.chunkable and any(state.slots.generating):
        taken.feed(refill.chunk)
        if taken.pass_.logits is None:
            refill.prefilling = taken
    return taken


def end_cancelled(slots: Slots, cancelled: list[int]) -> None:
    """Live queues: the rows of callers who left end now, with what they committed (their slots free)."""
    ending = set(cancelled)
    for slot in slots.live():
        if slots.caller_rows[slot] in ending:
            slots.finish(slot)


def grow_for_waiting(state: QueueState) -> None:
    """Live queues (the dynamic layout): as many slots more as prompts wait beyond the free ones, up to
    `Refill.slots` (none while a prompt's pass goes on: they wait behind it)."""
    refill, slots = state.settings.refill, state.slots
    if refill.slots is None or not state.drop_finished or refill.prefilling is not None:
        return
    pending = refill.queue.pending()
    extra = min(pending - len(slots.free(pending)), refill.slots - slots.batch)
    if extra > 0:
        grow(slots, extra, state.move_rows)


def join(state: QueueState, slot: int, taken: Taken) -> None:
    """Steps 1-5 for the `taken` prompt at `slot`: room, tokens, its keys and values (its pass finished here, or
    already in chunks), the first token (committed; the row ends at once where it ends there, or where its caller
    left while it was computed), the drafter."""
    began = time.perf_counter()
    slots, settings, refill, arrival = state.slots, state.settings, state.settings.refill, taken.arrival
    length = arrival.prompt.shape[0]
    make_room(slots, length, state.move_rows)
    state.selector.add_row(arrival.index, arrival.processors)
    limit = arrival.max_new_tokens if arrival.max_new_tokens is not None else settings.max_new_tokens
    joined = prefill_row(state, slot, taken, limit)
    done = taken.cancelled or ends_at_once(joined, slots, settings.eos_token_ids, settings.stop, limit)
    # a row that ended drops its processors (its hook)
    slots.commit({slot: 1}, {slot: done}, slots.length - 1, {slot: joined.scores[0]})
    if not done:
        state.drafter.insert_row(slot, refill.width(length), refill.pad_id)
    state.stats.record_join(taken.seconds + time.perf_counter() - began)


def make_room(slots: Slots, prompt_length: int, move_rows: MoveRows) -> None:
    """Move every row right so that a prompt of `prompt_length` tokens fits before the newest column (step 1):
    one `move_rows(move, pad, length)` through the slots, the target's cache and the drafter
    (`engine.state.DecodingState.move_rows`)."""
    columns = prompt_length + 1 - slots.length
    if columns <= 0:
        return
    move, pad = widen(slots.padding.host, columns, slots.ids.device)
    move_rows(move, pad, slots.length + columns)


def prefill_row(state: QueueState, slot: int, taken: Taken, limit: int) -> Joined:
    """Steps 2-4 for the `taken` prompt at `slot` (room made), its token limit `limit`: its tokens, its keys and
    values, its first token."""
    slots, refill, arrival = state.slots, state.settings.refill, taken.arrival
    pad = slots.join(slot, taken.pass_.tokens[0, -arrival.prompt.shape[0] :], arrival.index, limit, refill.pad_id,
                     taken.began)  # fmt: skip
    logits = state.target.insert_row(slot, taken.pass_, pad, arrival.prompt.shape[0])  # [1, 1, V]
    own = RowStarts([pad], [arrival.index])
    context = slots.ids[slot : slot + 1, : slots.length - 1]
    first, scores = choose_first(logits, context, state.selector, state.generator, own)  # [1], [1, 1, V]
    slots.place_first(slot, first)
    return Joined(slot, arrival.index, first, logits, scores, pad)


def choose_first(
    logits: torch.Tensor,
    context: torch.Tensor,
    selector: TokenSelector,
    generator: torch.Generator | None,
    starts: RowStarts | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the token after `context` [B], its processed scores [B, 1, V]) from the last position's `logits`, as the
    prompt pass chooses it."""
    scores = selector.scores(logits, context, starts)
    if selector.do_sample:
        return sample(torch.softmax(scores, dim=-1), generator)[:, -1], scores
    return scores.argmax(dim=-1)[:, -1], scores


def ends_at_once(joined: Joined, slots: Slots, eos_token_ids: torch.Tensor | None, stop, max_new_tokens: int) -> bool:
    """Whether the joined row's first token ends it: EOS, a stop string or criterion, or a limit of one token."""
    if max_new_tokens == 1:
        return True
    if eos_token_ids is not None and bool(torch.isin(joined.first, eos_token_ids).any()):
        return True
    if stop is not None:
        rows = RowStarts([joined.pad], [joined.index])
        row = slots.ids[joined.slot : joined.slot + 1]
        return bool(stop.hits(row, slots.length - 1, 1, joined.logits[:, -1:], rows).any())
    return False


def grow(slots: Slots, rows: int, move_rows: MoveRows) -> None:
    """Live queues: `rows` more slots at the end, copies of slot 0 that do not generate (`Slots.move`; one
    `move_rows` through the slots, the target's cache and the drafter), which a joining prompt overwrites, as it
    overwrites a finished row's slot."""
    pad = slots.padding.host
    kept = tuple(range(len(pad))) + (0,) * rows
    device = slots.ids.device
    move = RowMove(torch.tensor(kept, device=device), torch.zeros(len(kept), dtype=torch.long, device=device),
                   (0,) * len(kept), kept)  # fmt: skip
    move_rows(move, [*pad, *([pad[0]] * rows)], slots.length)

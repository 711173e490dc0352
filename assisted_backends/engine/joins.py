"""Many prompts through a fixed number of slots: a finished row's slot takes the next prompt of a queue.

Design (docs/design.md "Many prompts through a fixed number of slots"). The batch keeps the layout of
`engine.realign`: left padding, then each row's tokens, every row ending at the shared column L, the
newest committed token (column L − 1) pending for the target, whose cache holds columns [0, L − 1). A
prompt x of P tokens joins at slot b, left by a row that ended, as if it had always been
there with L − 1 − P columns of padding:

1. room: if P + 1 > L every row moves right by P + 1 − L (`realign.widen`: one `RowMove` through the
   buffer, the target's cache and the drafter, the machinery rows already move with); L = P + 1;
2. tokens: columns [L − 1 − P, L − 1) of row b take x, the padding before them the pad id;
3. prefill: one pass of the target over x alone (`ModelRunner.insert_row`: a one-row cache of the same
   layout kind, left-padded to the prompt's bucket under static shapes), whose P positions' keys and
   values are written into row b of the target's cache at the same columns; position ids are column
   minus padding, so the keys carry the positions `model.generate` gives x alone;
4. first token: chosen from that pass's last logits by the row's own processors (built for x alone),
   as the prefill of `model.generate` chooses it; it sits at column L − 1, pending like every row's
   newest token. EOS, a stop string or max_new_tokens = 1 end the row at once, and the slot takes the next prompt;
5. the drafter follows (`Drafter.insert_row`): a draft model writes what its cache holds of the row
   (its own one-row pass; the rest is fed as pending tokens in its next catch-up), an early-exit view
   copies its layers from the target's cache, a draft of another tokenizer gets a fresh per-row state,
   prompt lookup keeps none.

The loop (`engine.loop.decode`) then goes on with the same rounds: nothing else knows that a row is new.

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

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers.generation.logits_process import LogitsProcessor

from assisted_backends.engine.kv_cache import bucketed
from assisted_backends.engine.realign import RowMove, widen
from assisted_backends.engine.runner import Runner
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.tokens import RowStarts, TokenBuffer

MoveRows = Callable[[RowMove, list[int], int], None]  # (move, the rows' new padding, their shared length after)


@dataclass(frozen=True)
class Arrival:
    """A prompt taking a slot: `index` its position in the caller's queue (its caller row), `prompt` [P] its
    token ids, `processors` the logits processors `model.generate` builds for that prompt alone."""

    index: int
    prompt: torch.Tensor
    processors: list[LogitsProcessor]
    max_new_tokens: int | None = None  # the row's own limit (None: the call's)


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
    limits: dict[int, int] = field(default_factory=dict)  # caller row -> its own max_new_tokens
    on_round: Callable[[GenerationStats], None] | None = None  # live queues: the call's statistics after each round

    def width(self, prompt_length: int) -> int:
        """Columns of a joining prompt's own pass: its bucket under static shapes, else its length."""
        return bucketed(prompt_length, self.bucket) if self.bucket else prompt_length

    def limit(self, row: int, default: int) -> int:
        """The token limit of caller row `row`: its own, else the call's `default`."""
        return self.limits.get(row, default)


@dataclass(frozen=True)
class Joined:
    """A row that joined at `slot`: its first token and whether that token already ended it."""

    slot: int
    index: int
    first: torch.Tensor  # [1] the first new token
    logits: torch.Tensor  # [1, 1, V] the prompt pass's last logits
    pad: int


def make_room(buffer: TokenBuffer, prompt_length: int, move_rows: MoveRows) -> None:
    """Move every row right so that a prompt of `prompt_length` tokens fits before the newest column (step 1):
    one `move_rows(move, pad, length)` through the buffer, the target's cache and the drafter
    (`engine.state.DecodingState.move_rows`)."""
    columns = prompt_length + 1 - buffer.length
    if columns <= 0:
        return
    move, pad = widen(buffer.pad, columns, buffer.ids.device)
    move_rows(move, pad, buffer.length + columns)


def prefill_row(
    buffer: TokenBuffer, target: Runner, refill: Refill, slot: int, arrival: Arrival, choose_first: Callable
) -> Joined:
    """Steps 2-4 for `arrival` at `slot` (room made): its tokens, its pass, its first token."""
    prompt = arrival.prompt.to(buffer.ids.device)
    pad = buffer.place_row(slot, prompt, arrival.index, refill.pad_id)
    length = prompt.shape[0]
    logits = target.insert_row(slot, prompt, pad, length, refill.width(length), refill.pad_id)  # [1, 1, V]
    rows = RowStarts([pad], [arrival.index])
    first = choose_first(logits, buffer.ids[slot : slot + 1, : buffer.length - 1], rows)  # [1]
    buffer.ids[slot, buffer.length - 1] = first[0]
    return Joined(slot, arrival.index, first, logits, pad)


def ends_at_once(
    joined: Joined, buffer: TokenBuffer, eos_token_ids: torch.Tensor | None, stop, max_new_tokens: int
) -> bool:
    """Whether the joined row's first token ends it: EOS, a stop string or criterion, or a limit of one token."""
    if max_new_tokens == 1:
        return True
    if eos_token_ids is not None and bool(torch.isin(joined.first, eos_token_ids).any()):
        return True
    if stop is not None:
        rows = RowStarts([joined.pad], [joined.index])
        row = buffer.ids[joined.slot : joined.slot + 1]
        return bool(stop.hits(row, buffer.length - 1, 1, joined.logits[:, -1:], rows).any())
    return False


def free_slots(live: list[bool], pending: int) -> list[int]:
    """The slots a queue refills now: the first `pending` rows that do not generate."""
    return [b for b, alive in enumerate(live) if not alive][:pending]


def grow(buffer: TokenBuffer, rows: int, move_rows: MoveRows) -> None:
    """Live queues: `rows` more slots at the end, copies of row 0 (one `move_rows` through the buffer, the
    target's cache and the drafter) that a joining prompt overwrites, as it overwrites a finished row's slot."""
    batch = len(buffer.pad)
    kept = tuple(range(batch)) + (0,) * rows
    device = buffer.ids.device
    move = RowMove(torch.tensor(kept, device=device), torch.zeros(len(kept), dtype=torch.long, device=device),
                   (0,) * len(kept), kept)  # fmt: skip
    move_rows(move, [*buffer.pad, *([buffer.pad[0]] * rows)], buffer.length)

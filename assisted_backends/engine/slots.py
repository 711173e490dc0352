"""`Slots`: the batch's slots, with one owner. Each slot's token ids, its left padding, the caller's row it serves,
its new tokens, whether it still generates, its token limit, its statistics, its result and (when asked) its
tokens' log-probabilities live here, and change only through this object's operations:

- `open` (the call starts: limits, statistics, the finish hook), `join` and `place_first` (queues: a prompt takes a
  slot, `engine.joins`);
- `write_draft` (a drafter's proposal, or a token tree's accepted path, in the scratch columns past `length`) and
  `place_target_tokens` (y_b after each slot's n_b accepted drafts);
- `commit` (slots commit their round's tokens, with the log-probabilities of the scores they were chosen from
  when a `LogprobRecord` keeps them; those that end finish: their result kept, the hook called),
  `finish` (a live queue's caller left), `end_round` (the shared length after a round);
- `move` (`engine.realign`: rows kept, shifted, copied when the batch grows; every per-slot list follows at once).

Why one object grown from the token buffer rather than a token buffer beside a list of live rows (as vLLM v1's
`InputBatch` holds the token ids with every per-request list): the lists of the slots were kept in step by hand in
six places, and a move of the rows must move every one of them at once; drafters and runners read the same object
(the ids, `length`, `padding`, `row_starts`), so nothing copies. The left padding is exposed one way, `padding`
(`RowPadding`: `host` list, `tensor` on the device), shared with the runners' cache layouts and the EAGLE head's
cache, so a move or a join changes it for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from assisted_backends.engine.outputs import LogprobRecord
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.stats import GenerationStats, RowStats


@dataclass(frozen=True)
class RowStarts:
    """Batches: the column where each slot's tokens begin, and each slot's row in the caller's batch."""

    starts: list[int]
    caller_rows: list[int]


# The processed scores behind a commit, by slot: a round's [B, m, V], or {slot: [m, V]} for one joining slot.
ScoresBySlot = torch.Tensor | Mapping[int, torch.Tensor]


class RowPadding:
    """Each slot's left padding in columns, held once: `Slots` owns it (`host`, a list) and the cache layouts of runners
    over the same slots read it (`tensor`, [B] on the device, made once per change). `version` counts the changes, for
    layouts that keep something built from it (a static mask)."""

    def __init__(self, pads: Sequence[int], device: torch.device | str = "cpu") -> None:
        self.host = [int(pad) for pad in pads]
        self.device = torch.device(device)
        self.version = 0
        self._tensor: torch.Tensor | None = None

    @classmethod
    def of(cls, pad: torch.Tensor | RowPadding) -> RowPadding:
        """`pad` itself when it is a `RowPadding` (shared), else a new one holding the tensor's values."""
        if isinstance(pad, RowPadding):
            return pad
        padding = cls(pad.tolist(), pad.device)
        padding._tensor = pad
        return padding

    @property
    def tensor(self) -> torch.Tensor:
        """[B] the padding on the device."""
        if self._tensor is None:
            self._tensor = torch.tensor(self.host, device=self.device)
        return self._tensor

    def any(self) -> bool:
        """Whether some slot has padding (read on the host: no device sync)."""
        return any(self.host)

    def replace(self, pads: Sequence[int]) -> None:
        """Every slot's padding anew (rows moved, left or joined)."""
        self.host = [int(pad) for pad in pads]
        self._changed()

    def set_row(self, slot: int, pad: int) -> None:
        """The slot `slot` has `pad` columns of padding (a queue's prompt took it)."""
        if self.host[slot] != pad:
            self.host[slot] = int(pad)
            self._changed()

    def _changed(self) -> None:
        self._tensor = None
        self.version += 1


class Slots:
    """B slots of token ids [B, capacity] of which the first `length` columns are committed.

    Positions past `length` are scratch space: the drafter writes its proposal there (`write_draft`), so the
    target's verification input and every processor's prefix are views, never copies. Every slot is left padding
    (`padding.host[b]` columns), then its tokens, all slots ending at column `length` (`engine.realign`);
    `caller_rows[b]` is the caller's index of the row in slot b, `new_tokens[b]` what it committed after its prompt,
    `generating[b]` whether it still generates, `limits[b]` its token limit; `rows` the statistics and `results` the
    new tokens of the rows that finished, both by the caller's index. The last `filler_rows` slots only fill a batch
    up to its bucket (static shapes): copies of slot 0 that never generate. `batched`: the slots realign after each
    round (several, or one slot of a queue). `columns`: inputs given per prompt column (`token_type_ids`,
    `position_ids`, and an `attention_mask` with holes) [B, capacity], continued past the prompt as `model.generate`
    continues them (the last type repeated, positions + 1, new columns attended). `logprobs`: the record of each
    committed token's log-probabilities by the caller's index (None: none kept, nothing computed).
    """

    def __init__(
        self,
        prompt: torch.Tensor,
        capacity: int,
        fill_value: int,
        pad: list[int] | None = None,
        filler_rows: int = 0,
        columns: dict[str, torch.Tensor] | None = None,
        queue: bool = False,
        logprobs: LogprobRecord | None = None,
    ) -> None:
        batch, prompt_length = prompt.shape
        self.ids = torch.full((batch, capacity), fill_value, dtype=torch.long, device=prompt.device)
        self.ids[:, :prompt_length] = prompt
        self.length = prompt_length
        self.batched = batch > 1 or queue  # a queue's rows are realigned even in one slot
        self.padding = RowPadding(pad if pad is not None else [0] * batch, prompt.device)
        self.filler_rows = filler_rows
        callers = batch - filler_rows
        self.caller_rows = list(range(callers)) + [0] * filler_rows
        self.new_tokens = [0] * batch  # committed after the prompt, per slot
        self.generating = [True] * callers + [False] * filler_rows  # False: finished or filler, riding along
        self.limits = [0] * batch  # each slot's token limit (`open`)
        self.rows = [RowStats() for _ in range(callers)]  # by the caller's row index
        self.results: dict[int, torch.Tensor] = {}
        self.logprobs = logprobs
        self.columns = {name: _continued(name, given, capacity) for name, given in (columns or {}).items()}
        self.started = time.perf_counter()  # the call's start (`open` sets it again as decoding begins)
        self._on_finish: Callable[[int, torch.Tensor], None] | None = None

    # --- reading ----------------------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.ids.shape[1]

    @property
    def batch(self) -> int:
        return self.ids.shape[0]

    def live(self) -> list[int]:
        """The slots still generating."""
        return [b for b, alive in enumerate(self.generating) if alive]

    def free(self, wanted: int) -> list[int]:
        """The first `wanted` slots that do not generate (a queue's next prompts take them)."""
        return [b for b, alive in enumerate(self.generating) if not alive][:wanted]

    def remaining(self, slot: int) -> int:
        """The tokens slot `slot` may still commit."""
        return self.limits[slot] - self.new_tokens[slot]

    def tokens_left(self) -> int:
        """The most new tokens a slot still generating may yet commit."""
        return max(self.remaining(b) for b in self.live())

    def committed(self) -> torch.Tensor:
        """[B, length] view of the committed tokens."""
        return self.ids[:, : self.length]

    def through(self, end: int) -> torch.Tensor:
        """[B, end] view of committed plus scratch tokens."""
        return self.ids[:, :end]

    def row_starts(self) -> RowStarts | None:
        """Batches: where each slot's tokens begin (processors and stop criteria see each row without its
        padding, as `model.generate` on that prompt alone); None for one slot (its prefix is as given)."""
        return RowStarts(self.padding.host, self.caller_rows) if self.batched else None

    def column_inputs(self, start: int, end: int) -> dict[str, torch.Tensor]:
        """The per-column forward inputs of columns [start, end) ([B, end − start] each), the mask excepted."""
        return {name: table[:, start:end] for name, table in self.columns.items() if name != "attention_mask"}

    def holes(self, width: int) -> torch.Tensor | None:
        """[B, width] 0 where a column inside a row is masked (a mask with holes), else None."""
        table = self.columns.get("attention_mask")
        if table is None:
            return None
        extra = width - table.shape[1]  # a static cache rounds the capacity up to its bucket: attended
        return table[:, :width] if extra <= 0 else torch.nn.functional.pad(table, (0, extra), value=1)

    def row_tokens(self, slot: int, end: int, count: int) -> torch.Tensor:
        """[count] the last `count` tokens of slot `slot` that end before column `end`."""
        return self.ids[slot, end - count : end]

    def row_view(self, slot: int) -> OneSlotView:
        """Slot `slot` as a one-slot batch, reading and writing through to this one."""
        return OneSlotView(self, slot)

    # --- the operations -----------------------------------------------------------------------------------------

    def open(
        self, stats: GenerationStats, limit: int, own_limits: dict[int, int],
        on_finish: Callable[[int, torch.Tensor], None] | None,
    ) -> None:  # fmt: skip
        """The call starts: each slot's token limit (`limit`, or its caller row's own in `own_limits`), the
        statistics its rows report into (`stats.rows`) and `on_finish(caller row, tokens)`, called as each row ends."""
        self.limits = [own_limits.get(row, limit) for row in self.caller_rows]
        self._on_finish = on_finish
        stats.track_rows(self.rows)
        self.started = time.perf_counter()  # rows' join and finish times count from here, as the call's totals do

    def write_draft(self, column: int, tokens: torch.Tensor, slot: int | None = None) -> None:
        """Draft tokens at columns [column, column + k) of every slot (`tokens` [B, k], or [B] for one column) or of
        `slot` alone (`tokens` [k]): scratch space only, past the committed columns."""
        if column < self.length:
            raise RuntimeError(f"a draft written at column {column} would overwrite committed tokens (< {self.length})")
        if slot is not None:
            self.ids[slot, column : column + tokens.shape[0]] = tokens
            return
        tokens = tokens[:, None] if tokens.dim() == 1 else tokens
        self.ids[:, column : column + tokens.shape[1]] = tokens

    def place_target_tokens(
        self, start: int, accepted: torch.Tensor, next_token: torch.Tensor, drafts: int
    ) -> torch.Tensor:
        """y_b at column start + n_b of each slot (after its n_b accepted drafts); the span [B, drafts + 1] from
        column `start`: the drafts, then scratch."""
        span = self.ids[:, start : start + drafts + 1]
        span.scatter_(1, accepted[:, None], next_token[:, None])
        return span

    def commit(
        self, counts: dict[int, int], done: dict[int, bool], end: int, scores: ScoresBySlot | None = None
    ) -> None:
        """Slot b committed counts[b] tokens ending before column end + counts[b], chosen from `scores[b]` [≥ counts[b],
        V] (the processed scores, by slot: read only where `logprobs` keeps them); those `done` finish: their new
        tokens are kept by the caller's index (`results`) and handed to the finish hook."""
        at = time.perf_counter() - self.started
        for b, count in counts.items():
            self.new_tokens[b] += count
            row = self.caller_rows[b]
            if self.logprobs is not None and scores is not None and count:
                self.logprobs.add(row, self.ids[b, end : end + count], scores[b])
            self.rows[row].record_commit(self.new_tokens[b])
            if done[b]:
                self.generating[b] = False
                self.rows[row].record_finish(at)
                self.results[row] = self.row_tokens(b, end + count, self.new_tokens[b]).clone()
                if self._on_finish is not None:
                    self._on_finish(row, self.results[row])

    def finish(self, slot: int) -> None:
        """Slot `slot` ends now with what it committed (a live queue's caller left)."""
        self.commit({slot: 0}, {slot: True}, self.length)

    def end_round(self, length: int) -> None:
        """After a round (or the prompt pass): every generating slot's committed tokens end before column `length`."""
        self.length = length

    def move(self, move: RowMove, pad: list[int], length: int) -> None:
        """Apply `move` (`engine.realign`): the slots kept (`move.kept`) with their new left padding `pad`, every
        generating slot ending before column `length` afterwards; ids, column inputs and every per-slot list move at
        once. A slot kept twice (the batch growing, `engine.joins.grow`) is an empty copy: it does not generate."""
        self.ids = move.apply(self.ids)
        self.columns = {name: move.apply(table) for name, table in self.columns.items()}
        self.padding.replace(pad)
        seen: set[int] = set()
        generating = []
        for b in move.kept:
            generating.append(self.generating[b] and b not in seen)
            seen.add(b)
        self.generating = generating
        self.caller_rows = [self.caller_rows[b] for b in move.kept]
        self.new_tokens = [self.new_tokens[b] for b in move.kept]
        self.limits = [self.limits[b] for b in move.kept]
        self.length = length

    def join(self, slot: int, prompt: torch.Tensor, caller_row: int, limit: int, fill_value: int, at: float) -> int:
        """Queues (`engine.joins`): `slot` takes the caller's row `caller_row` (the next of the queue, rows join in
        order), whose prompt [P] ends at column length − 1 (the column of its first new token, the newest committed
        column of every slot), its prompt pass begun at `at`; return its left padding length − 1 − P (the caller
        made room: P < length)."""
        if caller_row != len(self.rows):
            raise RuntimeError(f"queue rows join in order: expected row {len(self.rows)}, got {caller_row}")
        begin = self.length - 1 - prompt.shape[0]
        self.ids[slot, :begin] = fill_value
        self.ids[slot, begin : self.length - 1] = prompt
        self.padding.set_row(slot, begin)
        self.caller_rows[slot] = caller_row
        self.new_tokens[slot] = 0
        self.limits[slot] = limit
        self.generating[slot] = True
        self.rows.append(RowStats(joined_s=at - self.started))
        return begin

    def place_first(self, slot: int, token: torch.Tensor) -> None:
        """The joined slot's first new token [1] at column length − 1 (committed by the next `commit`)."""
        self.ids[slot, self.length - 1] = token[0]


class OneSlotView(Slots):
    """Slot `slot` of a `Slots` seen as one slot (ids [1, capacity]), for drafters whose state is per slot
    (`drafters.any_pair.rowwise`); reads and writes go to the parent's tensor."""

    batched = False

    def __init__(self, parent: Slots, slot: int) -> None:  # no own storage: nothing to allocate
        self.parent, self.slot = parent, slot
        self.padding, self.columns = RowPadding([parent.padding.host[slot]], parent.ids.device), {}

    @property
    def ids(self) -> torch.Tensor:
        return self.parent.ids[self.slot : self.slot + 1]

    @property
    def length(self) -> int:
        return self.parent.length


def _continued(name: str, given: torch.Tensor, capacity: int) -> torch.Tensor:
    """[B, capacity]: `given` [B, P], then what `model.generate` feeds after it: the last token type again,
    the last position + 1, + 2, ..., or attended columns."""
    batch, prompt_length = given.shape
    steps = torch.arange(1, capacity - prompt_length + 1, device=given.device)[None, :]  # [1, capacity − P]
    last = given[:, -1:]
    if name == "position_ids":
        tail = last + steps
    elif name == "attention_mask":
        tail = torch.ones_like(steps).expand(batch, -1)
    else:
        tail = last.expand(batch, capacity - prompt_length)
    return torch.cat([given, tail.to(given.dtype)], dim=1)

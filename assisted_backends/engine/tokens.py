"""TokenBuffer: the sequences being generated, preallocated once, and what travels with each column.

The buffer owns its state: `length` (the committed columns) and `new_tokens` (per row) change only through its
own methods (`commit`, `end_round`, `move_rows`, `place_row`), and each row's left padding is
held once (`RowPadding`), read by the cache layouts of the runners over the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from assisted_backends.engine.realign import RowMove


@dataclass(frozen=True)
class RowStarts:
    """Batches: the column where each row's tokens begin, and each slot's row in the caller's batch."""

    starts: list[int]
    caller_rows: list[int]


class RowPadding:
    """Each row's left padding in columns, held once: the token buffer owns it (`host`, a list) and the cache
    layouts of runners over the same rows read it (`tensor`, [B] on the device, made once per change). `version`
    counts the changes, for layouts that keep something built from it (a static mask)."""

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
        """Whether some row has padding (read on the host: no device sync)."""
        return any(self.host)

    def replace(self, pads: Sequence[int]) -> None:
        """Every row's padding anew (rows moved, left or joined)."""
        self.host = [int(pad) for pad in pads]
        self._changed()

    def set_row(self, slot: int, pad: int) -> None:
        """The row at `slot` has `pad` columns of padding (a queue's prompt took its slot)."""
        if self.host[slot] != pad:
            self.host[slot] = int(pad)
            self._changed()

    def _changed(self) -> None:
        self._tensor = None
        self.version += 1


class TokenBuffer:
    """Token ids [B, capacity] of which the first `length` columns are committed.

    Positions past `length` are scratch space: the drafter writes its proposal there, so the
    target's verification input and every processor's prefix are views, never copies.
    Every row is left padding (`pad[b]` columns), then its tokens, all rows ending at column `length`
    (`engine.realign`); `caller_rows[b]` is the caller's index of the row in slot b, `results`
    the new tokens of rows that finished (by the caller's index). The last `filler_rows` rows only fill a
    batch up to its bucket (static shapes): copies of row 0 that are never read.
    `padding` is held here once and shared with the runners' cache layouts (`RowPadding`).
    `columns`: inputs given per prompt column (`token_type_ids`, `position_ids`, and an `attention_mask` with
    holes) [B, capacity], continued past the prompt as `model.generate` continues them (the last type repeated,
    positions + 1, new columns attended).
    """

    def __init__(
        self,
        prompt: torch.Tensor,
        capacity: int,
        fill_value: int,
        pad: list[int] | None = None,
        filler_rows: int = 0,
        columns: dict[str, torch.Tensor] | None = None,
    ) -> None:
        batch, prompt_length = prompt.shape
        self.ids = torch.full((batch, capacity), fill_value, dtype=torch.long, device=prompt.device)
        self.ids[:, :prompt_length] = prompt
        self.length = prompt_length
        self.batched = batch > 1
        self.padding = RowPadding(pad if pad is not None else [0] * batch, prompt.device)
        self.caller_rows = list(range(batch - filler_rows)) + [0] * filler_rows
        self.filler_rows = filler_rows
        self.new_tokens = [0] * batch  # committed after the prompt, per slot
        self.results: dict[int, torch.Tensor] = {}
        self.columns = {name: _continued(name, given, capacity) for name, given in (columns or {}).items()}

    @property
    def capacity(self) -> int:
        return self.ids.shape[1]

    @property
    def pad(self) -> list[int]:
        """Each row's left padding (columns), on the host."""
        return self.padding.host

    def committed(self) -> torch.Tensor:
        """[B, length] view of the committed tokens."""
        return self.ids[:, : self.length]

    def through(self, end: int) -> torch.Tensor:
        """[B, end] view of committed plus scratch tokens."""
        return self.ids[:, :end]

    def row_starts(self) -> RowStarts | None:
        """Batches: where each row's tokens begin (processors and stop criteria see each row without its
        padding, as `model.generate` on that prompt alone); None for one row (its prefix is as given)."""
        return RowStarts(self.pad, self.caller_rows) if self.batched else None

    def pad_tensor(self) -> torch.Tensor:
        """[B] each row's left padding, on the buffer's device."""
        return self.padding.tensor

    def commit(self, counts: dict[int, int]) -> None:
        """Row b (its slot) committed counts[b] more tokens (their columns written by the round)."""
        for b, count in counts.items():
            self.new_tokens[b] += count

    def end_round(self, length: int) -> None:
        """After a round (or the prompt pass): every generating row's committed tokens end before column `length`."""
        self.length = length

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
        """[count] the last `count` tokens of the row at `slot` that end before column `end`."""
        return self.ids[slot, end - count : end]

    def finish_row(self, slot: int, end: int) -> None:
        """Keep the new tokens of the row at `slot`, whose last one sits at column end − 1."""
        self.results[self.caller_rows[slot]] = self.row_tokens(slot, end, self.new_tokens[slot]).clone()

    def place_row(self, slot: int, prompt: torch.Tensor, caller_row: int, fill_value: int) -> int:
        """Queues (`engine.joins`): `slot` takes the caller's row `caller_row`, whose prompt
        [P] ends at column length − 1 (the column of its first new token, the newest committed column of every
        row); return its left padding length − 1 − P (the caller made room: P < length)."""
        begin = self.length - 1 - prompt.shape[0]
        self.ids[slot, :begin] = fill_value
        self.ids[slot, begin : self.length - 1] = prompt
        self.padding.set_row(slot, begin)
        self.caller_rows[slot] = caller_row
        self.new_tokens[slot] = 0
        return begin

    def row_view(self, slot: int) -> OneRowView:
        """The row at `slot` as a one-row buffer, reading through to this one."""
        return OneRowView(self, slot)

    def move_rows(self, move: RowMove, pad: list[int], length: int) -> None:
        """Apply `move` to the ids (and column inputs): the rows kept (`move.kept`) with their new left padding
        `pad`, every generating row ending before column `length` afterwards."""
        self.ids = move.apply(self.ids)
        self.columns = {name: move.apply(table) for name, table in self.columns.items()}
        self.padding.replace(pad)
        self.caller_rows = [self.caller_rows[b] for b in move.kept]
        self.new_tokens = [self.new_tokens[b] for b in move.kept]
        self.length = length


class OneRowView(TokenBuffer):
    """The row in `slot` of a `TokenBuffer` seen as a one-row buffer (ids [1, capacity]), for drafters whose state
    is per row (`drafters.any_pair.rowwise`); reads and writes go to the parent's tensor."""

    batched = False

    def __init__(self, parent: TokenBuffer, slot: int) -> None:  # no own storage: nothing to allocate
        self.parent, self.slot = parent, slot
        self.padding, self.columns = RowPadding([parent.pad[slot]], parent.ids.device), {}

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

"""TokenBuffer: the sequences being generated, preallocated once."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assisted_backends.engine.realign import RowMove


@dataclass(frozen=True)
class RowPrefixes:
    """Batches: the column where each row's tokens begin and its index in the caller's batch."""

    starts: list[int]
    rows: list[int]


class TokenBuffer:
    """Token ids [B, capacity] of which the first `length` columns are committed.

    Positions past `length` are scratch space: the drafter writes its proposal there, so the
    target's verification input and every processor's prefix are views, never copies.
    Every row is left padding (`pad[b]` columns), then its tokens, all rows ending at column `length`
    (`engine.realign`); `rows[b]` is the caller's index of the row at batch position b, `results` the new
    tokens of rows that finished (by the caller's index). The last `riders` rows only fill a batch up
    to a bucket (static shapes): copies of row 0 that are never read.
    """

    def __init__(
        self, prompt: torch.Tensor, capacity: int, fill_value: int, pad: list[int] | None = None, riders: int = 0
    ) -> None:
        batch, prompt_length = prompt.shape
        self.ids = torch.full((batch, capacity), fill_value, dtype=torch.long, device=prompt.device)
        self.ids[:, :prompt_length] = prompt
        self.length = prompt_length
        self.prompt_length = prompt_length
        self.batched = batch > 1
        self.pad = list(pad) if pad is not None else [0] * batch
        self.rows = list(range(batch - riders)) + [0] * riders
        self.riders = riders
        self.new_tokens = [0] * batch  # committed after the prompt, per batch position
        self.results: dict[int, torch.Tensor] = {}

    @property
    def capacity(self) -> int:
        return self.ids.shape[1]

    def committed(self) -> torch.Tensor:
        """[B, length] view of the committed tokens."""
        return self.ids[:, : self.length]

    def through(self, end: int) -> torch.Tensor:
        """[B, end] view of committed plus scratch tokens."""
        return self.ids[:, :end]

    def generated(self) -> torch.Tensor:
        """[B, length - prompt_length] the new tokens (one row: batches move rows, see `row_tokens`)."""
        return self.ids[:, self.prompt_length : self.length]

    def row_prefixes(self) -> RowPrefixes | None:
        """Batches: where each row's tokens begin (processors and stop criteria see each row without its
        padding, as `model.generate` on that prompt alone); None for one row (its prefix is as given)."""
        return RowPrefixes(self.pad, self.rows) if self.batched else None

    def pad_tensor(self) -> torch.Tensor:
        """[B] each row's left padding, on the buffer's device."""
        return torch.tensor(self.pad, device=self.ids.device)

    def row_tokens(self, position: int, end: int, count: int) -> torch.Tensor:
        """[count] the last `count` tokens of the row at batch `position` that end before column `end`."""
        return self.ids[position, end - count : end]

    def finish_row(self, position: int, end: int) -> None:
        """Keep the new tokens of the row at batch `position`, whose last one sits at column end − 1."""
        self.results[self.rows[position]] = self.row_tokens(position, end, self.new_tokens[position]).clone()

    def move_rows(self, move: RowMove, pad: list[int], kept: tuple[int, ...]) -> None:
        """Apply `move` to the ids; `pad` and `kept` (batch positions kept) describe the rows after it."""
        self.ids = move.apply(self.ids)
        self.pad = pad
        self.rows = [self.rows[b] for b in kept]
        self.new_tokens = [self.new_tokens[b] for b in kept]

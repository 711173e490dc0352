"""`HeadCache`: the EAGLE head's own keys and values, by column of the slots, preallocated once.

Column t of the cache holds the head's keys and values for the pair (e_{t+1}, a_t) (`drafters.eagle.head`).
Columns [0, `length`) are valid; a rollback moves `length` back (docs/design.md rule 5), later writes
overwrite what lies past it. The tensors span the slots' whole capacity, so the layout question
of the target's cache does not arise here: with `static` every attention reads all `capacity` columns under
a fixed-shape mask (bounded shapes, rule 8), otherwise only the columns written so far. Each row's left padding is
the slots' own (`RowPadding`, shared as the target's cache layout shares it): a move or a joining row changes it
for the head too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.slots import RowPadding


class HeadCache:
    """Keys and values [B, kv_heads, capacity, d] of one head, with the slots' left `padding` per row."""

    def __init__(
        self, batch: int, kv_heads: int, head_dim: int, capacity: int, padding: RowPadding, static: bool,
        dtype: torch.dtype, device: torch.device,
    ) -> None:  # fmt: skip
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.padding = padding
        self.static = static
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def pad(self, slot: int | None = None) -> torch.Tensor:
        """[B] each row's left padding (the slots'), or [1] the row at `slot`'s."""
        pad = self.padding.tensor
        return pad if slot is None else pad[slot : slot + 1]

    def attend_at(
        self, start: int, slot: int | None = None
    ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """The `Attend` for a forward whose first column is `start`, over every row or the row at `slot` alone:
        writes the new keys and values at [start, start + q) and attends each query column j to the columns c ≤ j
        of its row outside the left padding (and always to itself, so no row is fully masked)."""
        rows = slice(None) if slot is None else slice(slot, slot + 1)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            width = q.shape[2]
            end = start + width
            if end > self.capacity:
                raise RuntimeError(f"EAGLE head cache overflow: {end} columns > capacity {self.capacity}")
            self.keys[rows, :, start:end] = k
            self.values[rows, :, start:end] = v
            span = self.capacity if self.static else end
            keys = torch.arange(span, device=q.device)  # [S]
            queries = torch.arange(start, end, device=q.device)  # [q]
            causal = keys[None, :] <= queries[:, None]  # [q, S]
            outside_pad = keys[None, None, :] >= self.pad(slot)[:, None, None]  # [B, 1, S]
            mask = (causal[None] & outside_pad) | (keys[None, None, :] == queries[None, :, None])  # [B, q, S]
            return torch.nn.functional.scaled_dot_product_attention(
                q,
                self.keys[rows, :, :span],
                self.values[rows, :, :span],
                attn_mask=mask[:, None],
                enable_gqa=q.shape[1] != k.shape[1],
            )

        return attend

    def move_rows(self, move: RowMove, length: int) -> None:
        """Batches (`engine.realign`): move every row's columns by its shift; keep `length` columns (the padding is
        the slots', moved first)."""
        self.keys = move.apply(self.keys, seq_dim=2)
        self.values = move.apply(self.values, seq_dim=2)
        self.length = length

"""`HeadCache`: the EAGLE head's own keys and values, by buffer column, preallocated once.

Column t of the cache holds the head's keys and values for the pair (e_{t+1}, a_t) (`drafters.eagle.head`).
Columns [0, `length`) are valid; a rollback moves `length` back (docs/design.md rule 5), later writes
overwrite what lies past it. The tensors span the token buffer's whole capacity, so the layout question
of the target's cache does not arise here: with `static` every attention reads all `capacity` columns under
a fixed-shape mask (bounded shapes, rule 8), otherwise only the columns written so far.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from assisted_backends.engine.realign import RowMove


class HeadCache:
    """Keys and values [B, kv_heads, capacity, d] of one head, with left padding `pad` [B] per row."""

    def __init__(
        self, batch: int, kv_heads: int, head_dim: int, capacity: int, pad: torch.Tensor, static: bool,
        dtype: torch.dtype, device: torch.device,
    ) -> None:  # fmt: skip
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.pad = pad
        self.static = static
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def attend_at(self, start: int) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """The `Attend` for a forward whose first column is `start`: writes the new keys and values at
        [start, start + q) and attends each query column j to the columns c ≤ j of its row outside the left
        padding (and always to itself, so no row is fully masked)."""

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            width = q.shape[2]
            end = start + width
            if end > self.capacity:
                raise RuntimeError(f"EAGLE head cache overflow: {end} columns > capacity {self.capacity}")
            self.keys[:, :, start:end] = k
            self.values[:, :, start:end] = v
            span = self.capacity if self.static else end
            keys = torch.arange(span, device=q.device)  # [S]
            queries = torch.arange(start, end, device=q.device)  # [q]
            causal = keys[None, :] <= queries[:, None]  # [q, S]
            outside_pad = keys[None, None, :] >= self.pad[:, None, None]  # [B, 1, S]
            mask = (causal[None] & outside_pad) | (keys[None, None, :] == queries[None, :, None])  # [B, q, S]
            return torch.nn.functional.scaled_dot_product_attention(
                q,
                self.keys[:, :, :span],
                self.values[:, :, :span],
                attn_mask=mask[:, None],
                enable_gqa=q.shape[1] != k.shape[1],
            )

        return attend

    def move_rows(self, move: RowMove, pad: torch.Tensor, length: int) -> None:
        """Batches (`engine.realign`): move every row's columns by its shift; keep `length` columns."""
        self.keys = move.apply(self.keys, seq_dim=2)
        self.values = move.apply(self.values, seq_dim=2)
        self.pad = pad
        self.length = length

"""Batches: B rows that accept different numbers of draft tokens share one write position.

Design (docs/design.md rule 7, "Batches"): every row of the batch keeps the layout `model.generate` uses
for a batch, left padding then the row's tokens without holes, all rows ending at one shared column.
After a round in which row b accepted n_b of γ draft tokens, the rows are moved so that this holds again:
with N = max_b n_b over the rows still generating, row b moves right by s_b = N − n_b (its rejected tail
becomes left padding), then every row moves left by c = min_b (pad_b + s_b), which drops the padding all
rows share. So the shared length after the round is that of the longest row, never more than prompt +
max_new_tokens, and the tokens, the target's KV cache and the draft's KV cache move by the same per-row
shift (`RowMove`: one row selection per tensor), skipped when no row moves.

Why this and not the alternatives (docs/design.md "Batches"):
- ragged per-row write positions need a cache that writes each row at its own index; transformers'
  caches write every row at one `cache_position`, and HPU / CUDA graphs need one shape anyway;
- holes (rejected slots masked out, rows keeping them) leave the tokens as they are but break every
  model whose window or chunk is counted in cache positions (Mistral, Gemma 2/3, Qwen3 hybrids count
  holes as tokens), need compaction later anyway, and hand processors prefixes full of holes.
A row's position ids are its column minus its padding, so a moved row keeps the positions its keys
were computed (and rotated) with. Rows that finish leave the batch under the dynamic layout (one more
`index_select`, then smaller forwards); under static shapes they keep riding (their tokens are
discarded), so every forward keeps its [B, q] shape.

Cost against plain batched decoding (which needs no move): one copy of each model's cache per round
in which rows moved, about twice the memory traffic of reading the cache once in attention
(`GenerationStats.move_s` measures it: 1-7% of decode time in benchmarks/results/batched.json); no
lasting extra memory (each layer's keys, then values, are copied into a new tensor that replaces the
old one or is copied back into the static
cache in place, so one layer's tensor is the transient peak). Rows that finish early cost nothing more
under the dynamic layout; under static shapes they keep costing their share of every forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class RowMove:
    """Rows kept (`keep`, slots; None: all) and each kept row's right shift (negative: left)."""

    keep: torch.Tensor | None  # [B'] long
    shift: torch.Tensor  # [B'] long, on the device
    shifts: tuple[int, ...]  # the same on the host
    kept: tuple[int, ...]  # the slots kept, on the host (all of them when `keep` is None)
    _indices: dict = field(default_factory=dict, compare=False, repr=False)  # flat row indices by shape

    @property
    def moves_columns(self) -> bool:
        return any(self.shifts)

    def _sources(self, total: int, width: int, device: torch.device) -> torch.Tensor:
        """[B', width]: the column each output column comes from (clamped: filler columns copy an edge)."""
        columns = torch.arange(width, device=device)
        return (columns[None, :] - self.shift.to(device)[:, None]).clamp(0, total - 1)

    def apply(self, tensor: torch.Tensor, width: int | None = None, seq_dim: int = -1) -> torch.Tensor:
        """`tensor` [B, ..., T, ...] with its kept rows, each shifted along `seq_dim`, cut to `width` columns.

        Column j of row b becomes column j + shift_b; columns that come from outside [0, T) are filler
        (a copy of the nearest column) and always fall into the row's new left padding or past its end.
        A cache tensor [B, H, T, D] (seq_dim -2) moves as one `index_select` of its D-wide rows, with the
        index built once per shape and reused for every layer's keys and values (about a plain copy's
        cost; a `gather` along T was about ten times slower on CPU).
        """
        seq_dim = seq_dim % tensor.dim()
        total = tensor.shape[seq_dim]
        width = total if width is None else width
        if not self.moves_columns:
            tensor = tensor.index_select(0, self.keep) if self.keep is not None else tensor
            return tensor if width == total else tensor.narrow(seq_dim, 0, width)
        if tensor.dim() >= 3 and seq_dim == tensor.dim() - 2:
            return self._apply_rows(tensor, width)
        if self.keep is not None:
            tensor = tensor.index_select(0, self.keep)
        source = self._sources(total, width, tensor.device)  # [B', width]
        shape = [1] * tensor.dim()
        shape[0], shape[seq_dim] = source.shape
        expanded = list(tensor.shape)
        expanded[seq_dim] = width
        return tensor.gather(seq_dim, source.reshape(shape).expand(expanded))

    def _apply_rows(self, tensor: torch.Tensor, width: int) -> torch.Tensor:
        batch, *middle, total, depth = tensor.shape
        key = (tuple(tensor.shape), width, tensor.device)
        index = self._indices.get(key)
        if index is None:
            inner = math.prod(middle)
            rows = self.keep if self.keep is not None else torch.arange(batch, device=tensor.device)
            first = (rows.to(tensor.device)[:, None] * inner + torch.arange(inner, device=tensor.device)) * total
            index = (first[:, :, None] + self._sources(total, width, tensor.device)[:, None, :]).reshape(-1)
            self._indices[key] = index
        flat = tensor.reshape(batch * math.prod(middle) * total, depth).index_select(0, index)
        return flat.reshape(len(self.shifts), *middle, width, depth)


def plan_move(
    pad: list[int],
    accepted: list[int],
    active: list[bool],
    stays: list[bool],
    device: torch.device,
) -> tuple[RowMove | None, list[int], int]:
    """The move after a round: (move or None when nothing moves, new pads, columns dropped on the left).

    `pad` [B]: each row's left padding before the move; `accepted` n_b; `active`: rows still generating
    after this round (at least one); `stays`: rows kept in the batch (every active row; finished rows that
    ride along unmoved except for the shared left cut, or whose slot a queued prompt takes next); the
    others leave.
    """
    rows = [b for b in range(len(pad)) if active[b]]
    most = max(accepted[b] for b in rows)
    right = [most - accepted[b] if active[b] else 0 for b in range(len(pad))]
    cut = min(pad[b] + right[b] for b in rows)
    kept = [b for b in range(len(pad)) if active[b] or stays[b]]
    shifts = [right[b] - cut for b in kept]
    new_pad = [max(pad[b] + shift, 0) for b, shift in zip(kept, shifts)]
    if len(kept) == len(pad) and not any(shifts):
        return None, new_pad, 0
    keep = torch.tensor(kept, device=device) if len(kept) != len(pad) else None
    move = RowMove(keep, torch.tensor(shifts, device=device), tuple(shifts), tuple(kept))
    return move, new_pad, cut


def widen(pad: list[int], columns: int, device: torch.device) -> tuple[RowMove, list[int]]:
    """Queues (`engine.joins`): every row moves `columns` right (a joining prompt is longer than the batch's
    shared length); (the move, the new pads). The columns that enter on the left are padding."""
    shifts = (columns,) * len(pad)
    move = RowMove(None, torch.full((len(pad),), columns, device=device), shifts, tuple(range(len(pad))))
    return move, [p + columns for p in pad]

"""Batches: B rows that accept different numbers of draft tokens share one write position.

Design (issue #14): every row of the batch keeps the layout `model.generate` uses for a batch, left
padding then the row's tokens without holes, all rows ending at one shared column. After a round in
which row b accepted n_b of γ draft tokens, the rows are moved so that this holds again: with
N = max_b n_b over the rows still generating, row b moves right by s_b = N − n_b (its rejected tail
becomes left padding), then every row moves left by c = min_b (pad_b + s_b), which drops the padding all
rows share. So the shared length after the round is that of the longest row, never more than
prompt + max_new_tokens, and the tokens, the target's KV cache and the draft's KV cache move by the
same per-row shift: one gather along the sequence axis (`RowMove`), skipped when every shift is 0.

Why this and not the alternatives (DESIGN.md "Batches"):
- ragged per-row write positions need a cache that writes each row at its own index; transformers'
  caches write every row at one `cache_position`, and HPU / CUDA graphs need one shape anyway;
- holes (rejected slots masked out, rows keeping them) leave the tokens as they are but break every
  model whose window or chunk is counted in cache positions (Mistral, Gemma 2/3, Qwen3 hybrids count
  holes as tokens), need compaction later anyway, and hand processors prefixes full of holes.
A row's position ids are its column minus its padding, so a moved row keeps the positions its keys
were computed (and rotated) with. Rows that finish leave the batch under the dynamic layout (one more
`index_select`, then smaller forwards); under static shapes they keep riding (their tokens are
discarded), so every forward keeps its [B, q] shape.

Cost against plain batched decoding (which needs no move): one gather of each model's cache per round
in which rows accepted different counts, about twice the memory traffic of reading the cache once in
attention (`GenerationStats.move_s` measures it); no lasting extra memory (each layer's keys, then
values, are gathered into a new tensor that replaces the old one or is copied back into the static
cache in place, so one layer's tensor is the transient peak). Rows that finish early cost nothing more
under the dynamic layout; under static shapes they keep costing their share of every forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowMove:
    """Rows kept (`keep`, batch positions; None: all) and each kept row's right shift (negative: left)."""

    keep: torch.Tensor | None  # [B'] long
    shift: torch.Tensor  # [B'] long, on the device
    shifts: tuple[int, ...]  # the same on the host

    @property
    def moves_columns(self) -> bool:
        return any(self.shifts)

    def apply(self, tensor: torch.Tensor, width: int | None = None, seq_dim: int = -1) -> torch.Tensor:
        """`tensor` [B, ..., T, ...] with its kept rows, each shifted along `seq_dim`, cut to `width` columns.

        Column j of row b becomes column j + shift_b; columns that come from outside [0, T) are filler
        (a copy of the nearest column) and always fall into the row's new left padding or past its end.
        """
        if self.keep is not None:
            tensor = tensor.index_select(0, self.keep)
        seq_dim = seq_dim % tensor.dim()
        total = tensor.shape[seq_dim]
        width = total if width is None else width
        if not self.moves_columns:
            return tensor if width == total else tensor.narrow(seq_dim, 0, width)
        columns = torch.arange(width, device=tensor.device)
        source = (columns[None, :] - self.shift.to(tensor.device)[:, None]).clamp(0, total - 1)  # [B', width]
        shape = [1] * tensor.dim()
        shape[0], shape[seq_dim] = source.shape
        expanded = list(tensor.shape)
        expanded[seq_dim] = width
        return tensor.gather(seq_dim, source.reshape(shape).expand(expanded))


def plan_move(
    pad: list[int],
    accepted: list[int],
    active: list[bool],
    drop_finished: bool,
    device: torch.device,
) -> tuple[RowMove | None, list[int], int]:
    """The move after a round: (move or None when nothing moves, new pads, columns dropped on the left).

    `pad` [B]: each row's left padding before the move; `accepted` n_b; `active`: rows still generating
    after this round (at least one). Finished rows leave when `drop_finished`, else ride along unmoved
    except for the shared left cut.
    """
    rows = [b for b in range(len(pad)) if active[b]]
    most = max(accepted[b] for b in rows)
    right = [most - accepted[b] if active[b] else 0 for b in range(len(pad))]
    cut = min(pad[b] + right[b] for b in rows)
    kept = rows if drop_finished else list(range(len(pad)))
    shifts = [right[b] - cut for b in kept]
    new_pad = [max(pad[b] + shift, 0) for b, shift in zip(kept, shifts)]
    if len(kept) == len(pad) and not any(shifts):
        return None, new_pad, 0
    keep = torch.tensor(kept, device=device) if len(kept) != len(pad) else None
    move = RowMove(keep, torch.tensor(shifts, device=device), tuple(shifts))
    return move, new_pad, cut

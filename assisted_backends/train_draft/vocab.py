"""The draft vocabulary: the V_d target tokens the target itself produces most often on the training text.

EAGLE-3 drafts over a reduced vocabulary so that the head's output layer is small (V_d × H instead of V × H).
The tokens kept are the most frequent among the target's own next-token choices (its argmax at every
trained position), ties and unseen tokens broken by id. `d2t[d]` = target id − d (target id = d + d2t[d]),
`t2d[v]` = whether target token v has a draft id; draft ids follow increasing target id, as SpecForge's.
"""

from __future__ import annotations

import torch


def choose_vocabulary(counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [V_d] int64, t2d [V] bool) for token counts [V] and V_d = min(size, V)."""
    vocab = counts.shape[0]
    size = min(size, vocab)
    order = sorted(range(vocab), key=lambda v: (-int(counts[v]), v))  # most frequent first, then by id
    kept = torch.tensor(sorted(order[:size]), dtype=torch.long)
    d2t = kept - torch.arange(size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    return d2t, t2d


def draft_ids(t2d: torch.Tensor) -> torch.Tensor:
    """[V] the draft id of every target token (−1 where it has none)."""
    lookup = torch.full(t2d.shape, -1, dtype=torch.long)
    lookup[t2d] = torch.arange(int(t2d.sum()))
    return lookup


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """The share of the target's choices that the draft vocabulary can propose."""
    total = float(counts.sum())
    return float(counts[t2d].sum()) / total if total else 0.0

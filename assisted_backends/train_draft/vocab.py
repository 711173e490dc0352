"""The draft vocabulary: the V_d target tokens the target itself produces most often on the training text.

EAGLE-3 drafts over a reduced vocabulary so that the head's output layer is small (V_d × H instead of V × H).
The tokens kept are the most frequent among the target's own next-token choices (its argmax at every
trained position), ties and unseen tokens broken by id. `d2t[d]` = target id − d (target id = d + d2t[d]),
`t2d[v]` = whether target token v has a draft id; draft ids follow increasing target id, as SpecForge's.

V_d itself can be measured (`size_for_coverage`): the smallest V_d whose tokens cover a goal share (0.95 by
default) of the target's choices; the head's output layer costs V_d × H per draft step, most of its step.
"""

from __future__ import annotations

from dataclasses import dataclass

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


# --- sizing V_d by measurement (`train-draft --draft-vocab auto`) ----------------------------------------------

DEFAULT_COVERAGE = 0.95  # `--vocab-coverage`: the share of the target's answer tokens the draft vocabulary covers
CURVE_START = 1024  # the curve's first size; then doubled up to V
SIZE_STEP = 256  # a chosen V_d is a multiple of this (whole tiles for the kernels), at least CURVE_START


@dataclass(frozen=True)
class VocabularyChoice:
    """V_d chosen for a coverage goal: `size`, the coverage it `reaches`, and the `curve` [(V_d, coverage)]."""

    size: int
    goal: float
    reaches: float
    curve: tuple[tuple[int, float], ...]

    def lines(self) -> list[str]:
        """The curve and the choice, for the run's log."""
        points = ", ".join(f"{_size_label(size)} {share:.3f}" for size, share in self.curve)
        return [f"draft vocabulary coverage of the target's answer tokens by V_d: {points}",
                f"draft vocabulary: V_d = {self.size} (coverage {self.reaches:.3f}, goal {self.goal:g})"]  # fmt: skip


def _size_label(size: int) -> str:
    return f"{size // 1024}k" if size % 1024 == 0 else str(size)


def _covered(counts: torch.Tensor) -> torch.Tensor:
    """[V] the share of the counts covered by the k + 1 most frequent tokens, k = 0 .. V − 1."""
    ordered = torch.sort(counts.double(), descending=True).values
    total = float(ordered.sum())
    return ordered.cumsum(0) / total if total else torch.zeros_like(ordered)


def coverage_curve(counts: torch.Tensor) -> list[tuple[int, float]]:
    """[(V_d, coverage)] at V_d = 1k, 2k, 4k, ... and V: the share of the target's chosen tokens (counts [V]) that
    the V_d most frequent ones make up."""
    covered, vocab = _covered(counts), counts.shape[0]
    sizes, size = [], CURVE_START
    while size < vocab:
        sizes.append(size)
        size *= 2
    sizes.append(vocab)
    return [(s, float(covered[s - 1])) for s in sizes]


def size_for_coverage(counts: torch.Tensor, goal: float = DEFAULT_COVERAGE) -> VocabularyChoice:
    """The smallest V_d (a multiple of 256, at least 1024, at most V) whose most frequent tokens cover `goal` of the
    target's chosen tokens (counts [V]), with the coverage curve."""
    if not 0.0 < goal <= 1.0:
        raise ValueError(f"coverage goal must be in (0, 1], got {goal}")
    covered, vocab = _covered(counts), counts.shape[0]
    needed = int(torch.searchsorted(covered, torch.tensor([goal - 1e-12], dtype=covered.dtype))[0]) + 1
    size = min(vocab, max(CURVE_START, -(-needed // SIZE_STEP) * SIZE_STEP))
    return VocabularyChoice(size, goal, float(covered[size - 1]) if vocab else 0.0, tuple(coverage_curve(counts)))

"""The logits behind each committed token, kept when the caller asks for them (`output_scores`, `output_logits`).

As transformers' assisted decoding returns them: per committed token, the target's raw logits at the
step that chose it and the processed scores (after every logits processor and, when sampling, every
warper) that plain decoding would have drawn it from. They come from the verify pass, so a kernel that
is not batch-invariant (fp32 matmul over γ + 1 rows on a CPU) can differ from plain decoding's logits in
the last bits; the tokens do not depend on that.
"""

from __future__ import annotations

import torch


class CommittedScores:
    """Per caller row, the raw logits and processed scores [V] of its committed tokens, in order."""

    def __init__(self, rows: int, logits: bool, scores: bool) -> None:
        self.want_logits, self.want_scores = logits, scores
        self.logits: list[list[torch.Tensor]] = [[] for _ in range(rows)]
        self.scores: list[list[torch.Tensor]] = [[] for _ in range(rows)]

    def add(self, row: int, logits: torch.Tensor, scores: torch.Tensor, count: int) -> None:
        """Row `row` committed `count` tokens chosen from logits[:count] / scores[:count] ([≥count, V] each)."""
        if self.want_logits:
            self.logits[row].extend(logits[:count].float().unbind(0))
        if self.want_scores:
            self.scores[row].extend(scores[:count].float().unbind(0))

    @staticmethod
    def by_index(per_row: list[list[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        """One [B, V] tensor per new token's index (a row that ended before it: NaN there), as transformers'
        `generate` returns its scores and logits."""
        count = max((len(row) for row in per_row), default=0)
        vocab = next((row[0].shape[-1] for row in per_row if row), 0)
        out = []
        for index in range(count):
            rows = [row[index] if index < len(row) else torch.full((vocab,), float("nan")) for row in per_row]
            out.append(torch.stack([r.to(rows[0].device) for r in rows]))
        return tuple(out)

    def as_outputs(self) -> dict[str, tuple[torch.Tensor, ...] | None]:
        """{"scores": ..., "logits": ...}: tuples by new token index, None for what was not asked."""
        return {
            "scores": self.by_index(self.scores) if self.want_scores else None,
            "logits": self.by_index(self.logits) if self.want_logits else None,
        }

"""The logits behind each committed token, kept when the caller asks for them (`output_scores`, `output_logits`),
and, for a queue of prompts, their log-probabilities (`LogprobRecord`, `logprobs=`).

As transformers' assisted decoding returns them: per committed token, the target's raw logits at the
step that chose it and the processed scores (after every logits processor and, when sampling, every
warper) that plain decoding would have drawn it from. They come from the verify pass, so a kernel that
is not batch-invariant (fp32 matmul over γ + 1 rows on a CPU) can differ from plain decoding's logits in
the last bits; the tokens do not depend on that.

Log-probabilities are those of the processed scores: log softmax of the scores plain decoding chose the token
from (after the row's logits processors and, when sampling, the warpers: temperature, top-k, top-p, ...), the
log_softmax of `generate(output_scores=True)`'s scores. Greedy, the chosen token is the top one. A token a warper
removed has log-probability −inf.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class TokenLogprobs:
    """One row's committed tokens t_i [n] with log p(t_i) (`logprobs` [n]) and the `top` most likely tokens at each
    position (`top_ids`, `top_logprobs` [n, top], most likely first), under the processed scores (module docstring)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]


class LogprobRecord:
    """Per caller row, the log-probabilities of the tokens it commits (`TokenLogprobs`), with the `top` most likely
    tokens at each. `engine.slots.Slots.commit` adds each row's committed tokens and the scores they were chosen
    from, so rows that join, move or finish are followed, and draft tokens rolled back never reach it; `row(i)`
    reads caller row i's tokens so far."""

    def __init__(self, top: int) -> None:
        self.top = top
        self._parts: dict[int, list[TokenLogprobs]] = {}

    def add(self, row: int, tokens: torch.Tensor, scores: torch.Tensor) -> None:
        """Row `row` committed `tokens` [c], chosen from the processed scores `scores` [≥c, V] (one row each)."""
        count = tokens.shape[0]
        if count == 0:
            return
        logprobs = torch.log_softmax(scores[:count].float(), dim=-1)  # [c, V]
        chosen = logprobs.gather(-1, tokens[:, None].to(logprobs.device))[:, 0]
        top_logprobs, top_ids = logprobs.topk(self.top, dim=-1)  # [c, top]
        self._parts.setdefault(row, []).append(TokenLogprobs(tokens.clone(), chosen, top_ids, top_logprobs))

    def row(self, row: int) -> TokenLogprobs:
        """Caller row `row`'s tokens so far and their log-probabilities (on the host)."""
        parts = self._parts.get(row)
        if not parts:
            return TokenLogprobs(*_empty(self.top))
        if len(parts) > 1:  # merged once: the next read starts from the merged part
            parts[:] = [TokenLogprobs(*(torch.cat(values) for values in zip(*(_fields(part) for part in parts))))]
        return TokenLogprobs(*(value.cpu() for value in _fields(parts[0])))

    def drop(self, row: int) -> None:
        """Forget row `row` (a live queue's caller has read it all)."""
        self._parts.pop(row, None)


def _fields(part: TokenLogprobs) -> tuple[torch.Tensor, ...]:
    return part.tokens, part.logprobs, part.top_ids, part.top_logprobs


def _empty(top: int) -> tuple[torch.Tensor, ...]:
    return torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0, top, dtype=torch.long), torch.zeros(0, top)

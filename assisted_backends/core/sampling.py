"""Turning logits into the distribution plain decoding would sample from.

`TokenSelector` applies transformers' own logits processors (repetition penalty, then temperature,
top-k, top-p: the order `model.generate` uses), so the target's p and the draft's q are exactly the
distributions plain sampling would draw from (DESIGN.md rule 2). Prefix-dependent processors see
the prefix extended by the earlier draft tokens of the same round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from the logits: greedy argmax, or sampling after warping."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None


class TokenSelector:
    """Processes logits [B, q, V] into scores, probabilities, and chosen tokens."""

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config
        self._prefix_processors: list[LogitsProcessor] = []
        self._warpers: list[LogitsProcessor] = []
        if config.repetition_penalty not in (None, 1.0):
            self._prefix_processors.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
        if config.do_sample:
            if config.temperature != 1.0:
                self._warpers.append(TemperatureLogitsWarper(config.temperature))
            if config.top_k:
                self._warpers.append(TopKLogitsWarper(config.top_k))
            if config.top_p is not None and config.top_p < 1.0:
                self._warpers.append(TopPLogitsWarper(config.top_p))

    @property
    def do_sample(self) -> bool:
        return self.config.do_sample

    def scores(self, logits: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Processed scores [B, q, V] for logits [B, q, V].

        `context` [B, L] ends with the token fed at the last of the q positions, so position j was
        computed after the prefix `context[:, : L - (q - 1 - j)]`.
        """
        batch, query_length, vocab = logits.shape
        if self._prefix_processors:
            rows = []
            for j in range(query_length):
                prefix = context[:, : context.shape[1] - (query_length - 1 - j)]
                row = logits[:, j, :]
                for processor in self._prefix_processors:
                    row = processor(prefix, row)
                rows.append(row)
            logits = torch.stack(rows, dim=1)
        if self._warpers:
            flat = logits.reshape(batch * query_length, vocab)
            for warper in self._warpers:  # temperature / top-k / top-p ignore the prefix
                flat = warper(None, flat)
            logits = flat.reshape(batch, query_length, vocab)
        return logits

    def probabilities(self, logits: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """p (or q) [B, q, V]: softmax of the processed scores."""
        return torch.softmax(self.scores(logits, context), dim=-1)

    def greedy(self, logits: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """argmax tokens [B, q]."""
        return self.scores(logits, context).argmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs` [..., V] -> [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])

"""Drafters: whatever proposes γ tokens for the target to verify.

A drafter writes its proposal into the token buffer's scratch space (positions
[length, length + γ)) and, when sampling, returns q [B, γ, V]: the exact distributions it drew
from. After verification the loop calls `rollback` so the drafter's state matches the committed
tokens again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector, sample
from assisted_backends.engine.tokens import TokenBuffer


@dataclass
class Proposal:
    """`count` draft tokens now sit at buffer.ids[:, length : length + count].

    q [B, count, V_target] is the distribution each was drawn from when sampling (None for greedy).
    A drafter may propose fewer than the γ asked for (a lookup with no match, a re-tokenization that
    came out shorter), never more; under static shapes it must propose exactly γ.
    """

    count: int
    q: torch.Tensor | None = None


class Drafter(ABC):
    name: str

    @property
    @abstractmethod
    def forward_count(self) -> int: ...

    @abstractmethod
    def prefill(self, buffer: TokenBuffer) -> None:
        """See the committed tokens (called once, before the first proposal; the last one may stay pending)."""

    @abstractmethod
    def propose(
        self, buffer: TokenBuffer, gamma: int, selector: TokenSelector, generator: torch.Generator | None
    ) -> Proposal:
        """Write up to γ tokens at buffer.ids[:, length : length + γ]."""

    @abstractmethod
    def rollback(self, buffer: TokenBuffer) -> None:
        """Forget everything past the committed tokens."""

    def move_rows(self, move: RowMove, buffer: TokenBuffer) -> None:
        """Batches: the buffer's rows just moved by `move` (`engine.realign`); follow them (stateless: nothing)."""
        return None


class ModelDrafter(Drafter):
    """A small causal LM with its own KV cache.

    The cache holds a prefix of the committed tokens; the rest ("pending": one token, two when all
    γ were accepted, more after rounds without speculation) is fed at the start of the next proposal.
    """

    name = "draft_model"

    def __init__(self, runner: ModelRunner, name: str = "draft_model") -> None:
        self.runner = runner
        self.name = name

    @property
    def forward_count(self) -> int:
        return self.runner.forward_count

    def prefill(self, buffer: TokenBuffer) -> None:
        self.runner.forward(buffer.ids[:, : buffer.length - 1], last_only=True)  # the newest stays pending

    def propose(
        self, buffer: TokenBuffer, gamma: int, selector: TokenSelector, generator: torch.Generator | None
    ) -> Proposal:
        start = buffer.length
        feed = buffer.ids[:, self.runner.length : start]  # pending committed tokens [B, >=1]
        distributions = []
        rows = buffer.row_prefixes()
        for i in range(gamma):
            logits = self.runner.forward(feed, last_only=True)  # [B, 1, V]
            context = buffer.through(start + i)
            if selector.do_sample:
                q_i = selector.probabilities(logits, context, rows)  # [B, 1, V]
                token = sample(q_i, generator)  # [B, 1]
                distributions.append(q_i)
            else:
                token = selector.greedy(logits, context, rows)  # [B, 1]
            buffer.ids[:, start + i] = token[:, 0]
            feed = buffer.ids[:, start + i : start + i + 1]
        return Proposal(gamma, torch.cat(distributions, dim=1) if distributions else None)

    def rollback(self, buffer: TokenBuffer) -> None:
        # Keep only committed tokens; the last committed one stays pending so that every proposal
        # starts by feeding at least one token.
        self.runner.rollback(min(self.runner.length, buffer.length - 1))

    def move_rows(self, move: RowMove, buffer: TokenBuffer) -> None:
        self.runner.move_rows(move, buffer.pad_tensor(), buffer.length - 1)

"""The `Drafter` protocol: what the loop (`engine.loop`) asks of whatever proposes γ tokens for the target to verify.

The protocol belongs to the layer that calls it: drafters (`assisted_backends.drafters`) implement it, the engine
never imports them. A drafter writes its proposal into the token buffer's scratch space (columns
[length, length + γ)) and, when sampling, returns q [B, γ, V]: the exact distributions it drew from. After
verification the loop calls `rollback` so the drafter's state matches the committed tokens again. A drafter
that can draft no further (its positions end) sets `stopped` and proposes nothing from then on: the draft only
ever changes speed, never whether a call runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.schedule import DraftSchedule
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
    stopped: str | None = None  # why drafting stopped for the rest of the call (None: it did not)

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

    def insert_row(self, buffer: TokenBuffer, position: int, width: int, pad_id: int) -> None:
        """Queues (`engine.joins`): the row at batch `position` is a new prompt, at columns
        [buffer.pad[position], buffer.length − 1), its first new token at column buffer.length − 1; take it in.
        `width`: the columns a one-row pass over the prompt feeds (its bucket under static shapes), padded with
        `pad_id`. Stateless drafters (prompt lookup) have nothing to do."""
        return None

    def schedule_for(self, schedule: DraftSchedule, buffer: TokenBuffer) -> DraftSchedule:
        """The schedule the loop runs this drafter with, given the call's `schedule`: that one, unless the drafter
        has several sources whose rounds learn their lengths apart (`drafters.eagle.combined`)."""
        return schedule

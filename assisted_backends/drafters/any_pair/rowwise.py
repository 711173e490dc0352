"""A batch drafted row by row: one single-row drafter per row, for drafters whose state is per row.

A draft of another tokenizer re-tokenizes each row's text into its own vocabulary, so its contexts and
KV caches have one length per row; `RowwiseDrafter` keeps one `TranslatingDrafter` (with a one-row
cache) per row, lets each propose on a one-row view of the batch, and pads shorter proposals to the
longest by repeating the row's last token with a point-mass q (as prompt lookup fills), so the loop
verifies one [B, γ + 1] block. Draft steps are not batched across rows; verification is.
"""

from __future__ import annotations

import torch

from assisted_backends.drafters.any_pair.drafter import TranslatingDrafter
from assisted_backends.drafters.base import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.tokens import TokenBuffer


class RowView:
    """Row b of a `TokenBuffer`, shaped as a one-row buffer (ids [1, capacity]) for a single-row drafter."""

    def __init__(self, buffer: TokenBuffer, position: int) -> None:
        self.buffer, self.position = buffer, position

    @property
    def ids(self) -> torch.Tensor:
        return self.buffer.ids[self.position : self.position + 1]

    @property
    def length(self) -> int:
        return self.buffer.length

    def committed(self) -> torch.Tensor:
        return self.ids[:, : self.length]

    def through(self, end: int) -> torch.Tensor:
        return self.ids[:, :end]

    def row_prefixes(self) -> None:
        return None


class RowwiseDrafter(Drafter):
    """One `TranslatingDrafter` per batch row (`drafters[b]` drafts row b)."""

    def __init__(self, drafters: list[TranslatingDrafter], vocab_size: int) -> None:
        self.drafters = drafters
        self.vocab_size = vocab_size
        self.name = drafters[0].name

    @property
    def forward_count(self) -> int:
        return sum(drafter.forward_count for drafter in self.drafters)

    def prefill(self, buffer: TokenBuffer) -> None:
        for position, drafter in enumerate(self.drafters):
            drafter.prefill(RowView(buffer, position))

    def rollback(self, buffer: TokenBuffer) -> None:
        for position, drafter in enumerate(self.drafters):
            drafter.rollback(RowView(buffer, position))

    def move_rows(self, move: RowMove, buffer: TokenBuffer) -> None:
        self.drafters = [self.drafters[b] for b in move.kept]
        for drafter, shift, pad in zip(self.drafters, move.shifts, buffer.pad):
            drafter.shift_columns(shift, pad)

    def propose(
        self, buffer: TokenBuffer, gamma: int, selector: TokenSelector, generator: torch.Generator | None
    ) -> Proposal:
        start = buffer.length
        proposals = [
            drafter.propose(RowView(buffer, b), gamma, selector, generator) for b, drafter in enumerate(self.drafters)
        ]
        count = max(proposal.count for proposal in proposals)
        if count == 0:
            return Proposal(0, None)
        for b, proposal in enumerate(proposals):  # fill: repeat the row's last token (its last committed one)
            if proposal.count < count:
                buffer.ids[b, start + proposal.count : start + count] = buffer.ids[b, start + proposal.count - 1]
        if not selector.do_sample:
            return Proposal(count, None)
        draft = buffer.ids[:, start : start + count]  # [B, count]
        q = torch.nn.functional.one_hot(draft, self.vocab_size).float()  # [B, count, V]: the fillers' point masses
        for b, proposal in enumerate(proposals):
            if proposal.count:
                q[b, : proposal.count] = proposal.q[0].to(q.dtype)
        return Proposal(count, q)

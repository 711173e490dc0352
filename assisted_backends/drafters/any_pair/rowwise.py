"""A batch drafted row by row: one single-row drafter per row, for drafters whose state is per row.

A draft of another tokenizer re-tokenizes each row's text into its own vocabulary, so its contexts and
KV caches have one length per row; `RowwiseDrafter` keeps one `TranslatingDrafter` (with a one-row
cache) per row, lets each propose on a one-row view of the batch, and pads shorter proposals to the
longest by repeating the row's last token with a point-mass q (as prompt lookup fills), so the loop
verifies one [B, γ + 1] block. Draft steps are not batched across rows; verification is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from assisted_backends.drafters.any_pair.drafter import TranslatingDrafter
from assisted_backends.drafters.base import fill_proposal
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.slots import Slots


class RowwiseDrafter(Drafter):
    """One `TranslatingDrafter` per batch row (`drafters[b]` drafts row b)."""

    def __init__(
        self,
        drafters: list[TranslatingDrafter],
        vocab_size: int,
        fresh: Callable[[], TranslatingDrafter] | None = None,
    ) -> None:
        self.drafters = drafters
        self.vocab_size = vocab_size
        self.name = drafters[0].name
        self.fresh = fresh  # a new one-row drafter, for a row that joins (queues)
        self.prefilled = False
        self.retired_forwards = 0  # forwards of the drafters of rows that were replaced

    @property
    def forward_count(self) -> int:
        return self.retired_forwards + sum(drafter.forward_count for drafter in self.drafters)

    def prefill(self, slots: Slots) -> None:
        self.prefilled = True
        for slot, drafter in enumerate(self.drafters):
            drafter.prefill(slots.row_view(slot))

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        """A joining row gets a drafter of its own, which reads the row's prompt now if the others have read theirs."""
        if self.fresh is None:
            raise NotImplementedError("this draft of another tokenizer was built without a factory for joining rows")
        self.retired_forwards += self.drafters[slot].forward_count
        drafter = self.fresh()
        drafter.shift_columns(0, slots.padding.host[slot])  # not prefilled: sets its padding
        self.drafters[slot] = drafter
        if self.prefilled:
            drafter.prefill(slots.row_view(slot))

    def rollback(self, slots: Slots) -> None:
        for slot, drafter in enumerate(self.drafters):
            drafter.rollback(slots.row_view(slot))

    def move_rows(self, move: RowMove, slots: Slots) -> None:
        self.drafters = [self.drafters[b] for b in move.kept]
        for drafter, shift, pad in zip(self.drafters, move.shifts, slots.padding.host):
            drafter.shift_columns(shift, pad)

    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        proposals = [
            drafter.propose(slots.row_view(b), gamma, selector, generator) for b, drafter in enumerate(self.drafters)
        ]
        count = max(proposal.count for proposal in proposals)
        if count == 0:
            return Proposal(0, None)
        written = [proposal.count for proposal in proposals]
        return fill_proposal(slots, written, count, self.vocab_size, selector.do_sample, [p.q for p in proposals])

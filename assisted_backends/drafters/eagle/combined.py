"""`LookupOrHead`: a prompt-lookup match when there is one, the EAGLE-3 head otherwise.

Prompt lookup costs nothing to draft and is long and right where the output copies its input (an edit, a
summary quoting its passage); the head drafts everywhere else. Each round asks the lookup first: when every
row has a match of at least two tokens it proposes (up to `lookup_tokens`, exactly γ under static shapes),
otherwise the head does (within the slots' scratch space; tokens past the call's limit are never committed).
Under the adaptive schedule each source has its own (`schedule_for`): a head that is rarely right stays plain where
lookup has no match, whatever lookup's acceptance.
The head keeps receiving the target's features on every round, so after lookup rounds its next proposal catches
up on the columns it skipped, as after plain rounds. Sampling: a lookup proposal's q
is a point mass, the head's is its own distribution; either is what the token was drawn from.
"""

from __future__ import annotations

import torch

from assisted_backends.drafters.eagle.drafter import EagleDrafter
from assisted_backends.drafters.prompt_lookup import PromptLookupDrafter, lookup
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.schedule import AdaptiveSchedule, DraftSchedule, SourceSchedule
from assisted_backends.engine.slots import Slots


class LookupOrHead(Drafter):
    name = "eagle3+lookup"

    def __init__(
        self, head: EagleDrafter, lookup_tokens: int, vocab_size: int, static_shapes: bool, free: Drafter | None = None
    ) -> None:
        self.head = head
        # `free`: another draft-free source with `matches(slots)` in place of prompt lookup (the suffix drafter)
        self.lookup = free if free is not None else PromptLookupDrafter(vocab_size, fixed_length=static_shapes)
        if free is not None:
            self.name = f"eagle3+{free.name}"
        self.lookup_tokens = lookup_tokens
        self.static_shapes = static_shapes
        self.lookup_rounds = 0
        self.head_rounds = 0
        self.own_lengths = False  # whether lookup rounds get their own γ (`schedule_for`)
        self._decided: str | None = None  # the source `source` chose for the round being drafted

    @property
    def forward_count(self) -> int:
        return self.head.forward_count

    def prefill(self, slots: Slots) -> None:
        self.head.prefill(slots)
        self.lookup.prefill(slots)

    def source(self, slots: Slots) -> str:
        """Where the next round's draft comes from: "lookup" when every row has a match, else "head". The schedule
        asks before the round; `propose` then takes that answer instead of searching again."""
        self._decided = "lookup" if self._every_row_matches(slots) else "head"
        return self._decided

    def schedule_for(self, head: DraftSchedule, slots: Slots) -> DraftSchedule:
        """An adaptive `head` schedule for head rounds, and a free drafter's for lookup rounds (up to the lookup
        length), each learning from its own rounds (`engine.schedule.SourceSchedule`); any other schedule as given."""
        if not isinstance(head, AdaptiveSchedule):
            return head
        lookup = AdaptiveSchedule(max_gamma=self.lookup_tokens, cost_prior=0.0, horizon=head.horizon)
        self.own_lengths = True  # γ is now the lookup schedule's own choice on lookup rounds
        return SourceSchedule({"head": head, "lookup": lookup}, lambda: self.source(slots))

    def _every_row_matches(self, slots: Slots) -> bool:
        matches = getattr(self.lookup, "matches", None)
        if matches is not None:
            return matches(slots)
        rows = slots.row_starts()
        starts = rows.starts if rows is not None else [0]
        return all(
            lookup(slots.ids[b, first : slots.length], self.lookup.max_ngram, 1, self.lookup.min_ngram).numel() > 0
            for b, first in enumerate(starts)
        )

    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        chosen, self._decided = self._decided or self.source(slots), None
        if chosen == "lookup":
            self.lookup_rounds += 1
            longest = gamma if self.own_lengths else max(gamma, self.lookup_tokens)  # one schedule: lookup's own length
            count = gamma if self.static_shapes else min(longest, slots.capacity - slots.length)
            return self.lookup.propose(slots, count, selector, generator)
        self.head_rounds += 1
        return self.head.propose(slots, gamma, selector, generator)

    def rollback(self, slots: Slots) -> None:
        self.head.rollback(slots)

    def move_rows(self, move: RowMove, slots: Slots) -> None:
        self.head.move_rows(move, slots)
        self.lookup.move_rows(move, slots)

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        self.head.insert_row(slots, slot, width, pad_id)
        self.lookup.insert_row(slots, slot, width, pad_id)

"""`ModelDrafter`: a small causal LM with its own KV cache, sharing the target's vocabulary.

The cache holds a prefix of the committed tokens; the rest ("pending": one token, two when all γ were
accepted, more after rounds without speculation) is fed at the start of the next proposal.

A draft may encode fewer positions than the call needs (`DraftLimits`: a learned position table, or a
bias table indexed by key length such as MPT's ALiBi). The target alone could serve the call, so the
draft never refuses it: once a proposal would pass either limit, drafting stops for the rest of the
call (`stopped` says why and where) and rounds are plain. Rotary drafts have no limit: like
transformers, they run past their trained length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assisted_backends.drafters.base import fill_proposal
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector, sample
from assisted_backends.engine.slots import Slots


@dataclass(frozen=True)
class DraftLimits:
    """`positions`: position ids the draft can encode (None: any); `keys`: keys its attention can span."""

    positions: int | None = None
    keys: int | None = None

    def exceeded(self, runner: ModelRunner, slots: Slots, end: int) -> str | None:
        """Why feeding the draft through column `end` (exclusive) is impossible, or None."""
        if self.positions is not None and end - min(slots.padding.host) > self.positions:
            return f"its {self.positions} positions end"
        keys = getattr(runner.layout, "capacity", end)  # a static cache is attended whole
        if self.keys is not None and keys > self.keys:
            return f"its attention spans at most {self.keys} keys"
        return None


class ModelDrafter(Drafter):
    """Drafts with `runner`'s model; `limits`: where its positions end; `fixed_length`: always γ tokens (then
    filler ones past the limits, a point mass on a vocabulary of `vocab_size` each)."""

    name = "draft_model"

    def __init__(
        self,
        runner: ModelRunner,
        name: str = "draft_model",
        limits: DraftLimits = DraftLimits(),
        fixed_length: bool = False,
        vocab_size: int = 0,
    ) -> None:
        self.runner = runner
        self.name = name
        self.limits = limits
        self.fixed_length = fixed_length
        self.vocab_size = vocab_size  # q's width for filler proposals (the target's vocabulary)

    @property
    def forward_count(self) -> int:
        return self.runner.forward_count

    def _stop_if_exceeded(self, slots: Slots, end: int) -> bool:
        if self.stopped is None:
            reason = self.limits.exceeded(self.runner, slots, end)
            if reason is not None:
                self.stopped = f"drafting stopped after {slots.length} columns: {reason}"
        return self.stopped is not None

    def prefill(self, slots: Slots) -> None:
        if self._stop_if_exceeded(slots, slots.length):
            return
        self.runner.forward(slots.ids[:, : slots.length - 1], last_only=True)  # the newest stays pending

    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        if self._stop_if_exceeded(slots, slots.length + gamma):
            if not self.fixed_length:
                return Proposal(0)
            return fill_proposal(slots, [0] * slots.ids.shape[0], gamma, self.vocab_size, selector.do_sample)
        start = slots.length
        feed = slots.ids[:, self.runner.length : start]  # pending committed tokens [B, >=1]
        distributions = []
        rows = slots.row_starts()
        for i in range(gamma):
            logits = self.runner.forward(feed, last_only=True)  # [B, 1, V]
            context = slots.through(start + i)
            if selector.do_sample:
                q_i = selector.probabilities(logits, context, rows)  # [B, 1, V]
                token = sample(q_i, generator)  # [B, 1]
                distributions.append(q_i)
            else:
                token = selector.greedy(logits, context, rows)  # [B, 1]
            slots.write_draft(start + i, token[:, 0])
            feed = slots.ids[:, start + i : start + i + 1]
        return Proposal(gamma, torch.cat(distributions, dim=1) if distributions else None)

    def rollback(self, slots: Slots) -> None:
        # Keep only committed tokens; the last committed one stays pending so that every proposal
        # starts by feeding at least one token.
        self.runner.rollback(min(self.runner.length, slots.length - 1))

    def move_rows(self, move: RowMove, slots: Slots) -> None:
        """The cache's rows follow the slots' (whose padding the runner reads: nothing to send)."""
        self.runner.move_rows(move, slots.length - 1)

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        """The draft's cache holds columns [0, runner.length) of every row: the joining row's prompt tokens among
        them come from a one-row pass over the prompt alone; the others are fed as pending tokens in the next
        proposal's catch-up. Before the draft's first prefill there is nothing to write."""
        pad = slots.padding.host[slot]
        held = self.runner.length - pad  # prompt positions this cache holds
        if held <= 0:
            self.runner.layout.set_row_pad(slot, pad)
            return
        prompt = slots.ids[slot, pad : slots.length - 1]
        self.runner.insert_row(slot, self.runner.row_pass(prompt, max(width, prompt.shape[0]), pad_id), pad, held)

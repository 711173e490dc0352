"""A draft model with another tokenizer than the target's.

Greedy: the draft runs γ steps in its own vocabulary; its tokens are translated to target tokens
through bytes (`translation.translate_proposal`) and at most γ of them are proposed.
Sampling: the draft samples only tokens both vocabularies share (`vocab_mapping.VocabIntersection`),
each draw is one target token, and q is the restricted distribution moved onto the target
vocabulary, so the loop's ordinary rejection sampling stays lossless.
In both modes the draft's context follows the committed target tokens through `DraftContext`, and
its KV cache is rolled back to the longest prefix it shares with the new context.

The draft reads the whole prompt when it is first asked to draft: on input-grounded tasks the passage
is what it copies from (Gemma 3 270M drafted by SmolLM2-135M, summarize with quotes, γ = 4: α 0.88
with the whole prompt, 0.13 with its last 32 tokens only). Whether that pass is worth paying for is
the schedule's decision (`AdaptiveSchedule.worth_trying`).
"""

from __future__ import annotations

import torch

from assisted_backends.drafters.any_pair.token_bytes import ByteCodec
from assisted_backends.drafters.any_pair.translation import (
    DEFAULT_TAIL,
    DEFAULT_WINDOW,
    DraftContext,
    translate_proposal,
)
from assisted_backends.drafters.any_pair.vocab_mapping import VocabIntersection, intersection_of
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector, sample
from assisted_backends.engine.slots import Slots


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class TranslatingDrafter(Drafter):
    """Drafts with `runner`'s model, whose tokenizer is `draft`, for a target whose tokenizer is `target`."""

    name = "draft_model_translated"
    # Greedy: γ counts *target* tokens; the draft runs until its text re-encodes to γ final target
    # tokens (ending before its last, maybe unfinished, word), at most this many draft steps per target token (+1).
    draft_steps_per_token = 3

    def __init__(
        self,
        runner: ModelRunner,
        target: ByteCodec,
        draft: ByteCodec,
        target_vocab: int,
        draft_vocab: int,
        window: int = DEFAULT_WINDOW,
        tail: int = DEFAULT_TAIL,
        max_positions: int | None = None,
    ) -> None:
        self.runner = runner
        self.target, self.draft = target, draft
        self.target_vocab, self.draft_vocab = target_vocab, draft_vocab
        self.window, self.tail = window, tail
        self.context = DraftContext(target, draft, window)
        self._intersection: VocabIntersection | None = None
        self._selector: TokenSelector | None = None
        self._cached: list[int] = []  # draft ids in the runner's cache
        self._seen = 0  # columns of the slots already in self.context
        self._prefilled = False
        capacity = getattr(runner.layout, "capacity", None)
        self._max_length = min(x for x in (max_positions, capacity, 1 << 62) if x is not None)

    @property
    def forward_count(self) -> int:
        return self.runner.forward_count

    def intersection(self) -> VocabIntersection:
        if self._intersection is None:
            device = self.runner.layout.pad.device
            shared = intersection_of(self.draft, self.target, self.draft_vocab, self.target_vocab)
            self._intersection = shared if shared.draft_ids.device == device else shared.to(device)
        return self._intersection

    def prefill(self, slots: Slots) -> None:
        self._prefilled = True
        pad = self.runner.layout.padding.host[0]
        filler = next((i for i in self.draft.special_ids.values() if i is not None), 0)
        self.context.add_filler(filler, pad)
        self._seen = pad
        self._sync(slots)
        prompt = self.context.ids[:-1]  # the last token stays pending for the first proposal
        if prompt and len(self.context.ids) <= self._max_length:
            self.runner.forward(torch.tensor([prompt], device=slots.ids.device), last_only=True)
            self._cached = list(prompt)

    def rollback(self, slots: Slots) -> None:
        self._sync(slots)

    def move_rows(self, move: RowMove, slots: Slots) -> None:
        """One slot (a batch drafts row by row, `drafters.any_pair.rowwise`): its row moved by `move`."""
        self.shift_columns(move.shifts[0], slots.padding.host[0])

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        """A joining row needs a drafter of its own: a queue drafts row by row (`drafters.any_pair.rowwise`)."""
        raise NotImplementedError("a draft of another tokenizer takes a queue's joining rows through RowwiseDrafter")

    def shift_columns(self, shift: int, pad: int) -> None:
        """Batches (`drafters.any_pair.rowwise`): this drafter's row moved `shift` columns right in the target's
        slots and now has `pad` columns of left padding (its one-row cache's own padding: its columns are the
        draft's, not the slots')."""
        if self._prefilled:
            self._seen = max(self._seen + shift, 0)
        else:
            self.runner.layout.set_row_pad(0, pad)

    def _sync(self, slots: Slots) -> None:
        """Bring the context up to the committed tokens; keep the cache's longest agreeing prefix."""
        if self._seen == slots.length and self._cached == self.context.ids[: len(self._cached)]:
            return
        self.context.extend(slots.ids[0, self._seen : slots.length].tolist())
        self._seen = slots.length
        keep = min(_common_prefix(self._cached, self.context.ids), len(self.context.ids) - 1)
        keep = max(keep, 0)
        self.runner.rollback(keep)
        del self._cached[keep:]

    def _draft_selector(self, selector: TokenSelector) -> TokenSelector:
        # The same processing as the target's (temperature, top-k/p, repetition penalty) on the draft's own
        # vocabulary and context; any q is lossless as long as it is the one sampled from.
        if self._selector is None or self._selector.config != selector.config:
            self._selector = TokenSelector(selector.config)
        return self._selector

    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        if self._seen != slots.length:  # rounds without drafting committed tokens we have not seen
            self._sync(slots)
        steps = gamma if selector.do_sample else self.draft_steps_per_token * gamma + 1
        steps = min(steps, self._max_length - len(self.context.ids))
        if not self.context.ids or steps < 1:
            return Proposal(0, None)  # no context to draft from, or the draft's positions are used up
        draft_selector = self._draft_selector(selector)
        device = slots.ids.device
        feed = self.context.ids[len(self._cached) :]
        drafted: list[int] = []
        targets: list[int] = []
        distributions = []
        tail = slots.ids[0, max(0, slots.length - self.tail) : slots.length].tolist()
        for _ in range(steps):
            logits = self.runner.forward(torch.tensor([feed], device=device), last_only=True)[:, -1]  # [B, V_d]
            self._cached += feed
            context = torch.tensor([self._cached], device=device)
            if selector.do_sample:
                q_restricted, mass = self.intersection().restrict(
                    draft_selector.probabilities(logits[:, None], context)[:, -1]
                )
                if float(mass[0]) <= 0.0:
                    break  # the draft puts no mass on shared tokens: nothing to propose from here
                token = int(sample(q_restricted, generator)[0])
                targets.append(int(self.intersection().target_of[token]))
                distributions.append(self.intersection().to_target(q_restricted))
                drafted.append(token)
                feed = [token]
                continue
            token = int(draft_selector.greedy(logits[:, None], context)[0, -1])
            drafted.append(token)
            feed = [token]
            if self.draft.is_special(token):
                break
            if len(drafted) >= gamma:
                translation = translate_proposal(drafted, tail, self.draft, self.target, self.tail)
                if translation.final >= gamma:
                    break
        if not selector.do_sample:
            translation = translate_proposal(drafted, tail, self.draft, self.target, self.tail)
            # Final tokens only (the last word may be unfinished), unless there are none.
            targets = translation.ids[: translation.final] if translation.final else translation.ids
        count = min(len(targets), gamma)
        if count:
            slots.write_draft(slots.length, torch.tensor(targets[:count], device=device), slot=0)
        q = torch.stack(distributions[:count], dim=1) if (selector.do_sample and count) else None  # [B, count, V]
        return Proposal(count, q)

"""`EagleDrafter`: chain drafting with an EAGLE-3 head that reads the target's hidden states.

The loop is the package's one loop (`engine.loop.decode`); only the proposal differs. With L committed
tokens (columns [0, L), the newest pending for the target) the target has computed the features of columns
[0, L − 1), and the head's cache holds the columns computed from them, [0, c). A proposal of γ tokens:

1. catch-up: one head forward over columns [c, L − 1) with a_t = g_t (the target's features; after a round,
   the pending token and the accepted drafts, n + 1 columns); its output at column L − 2 gives x_1;
2. chain: γ − 1 forwards of one column each, column L − 2 + i fed (x_i, o_{L−3+i}): the head's own output
   stands in for the target's features it does not have yet; each gives x_{i+1}.

A rollback keeps only the columns computed from the target's features (c = L − 1 of the round just drafted):
the self-fed columns are recomputed from the target's features once the verify pass has produced them, exactly
as a draft model's cache forgets rejected tokens. Sampling draws x_i from q_i, the head's distribution carried
onto the target's vocabulary through d2t (zero outside the mapped ids) after the call's logits processors; that
q_i is what the loop's lossless acceptance receives. Static shapes: the catch-up is always γ + 1 columns wide
(the columns past L − 1 are filler, overwritten later), so the head sees [B, P], [B, γ + 1] and [B, 1] only.
"""

from __future__ import annotations

import torch

from assisted_backends.drafters.base import fill_proposal
from assisted_backends.drafters.eagle.cache import HeadCache
from assisted_backends.drafters.eagle.features import FeatureStore
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.drafters.eagle.precision import HeadPrecision
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector, sample
from assisted_backends.engine.slots import Slots


class EagleDrafter(Drafter):
    """Drafts with `head` from the features `store` receives from the `target` runner's forwards."""

    name = "eagle3"

    def __init__(
        self, head: Eagle3Head, target: ModelRunner, store: FeatureStore, vocab_size: int, static_shapes: bool
    ) -> None:
        self.head = head
        self.target = target
        self.store = store
        self.vocab_size = vocab_size  # V: the target's logits width
        self.static_shapes = static_shapes
        self.cache: HeadCache | None = None
        self.exact = 0  # columns [0, exact) of the head's cache were computed from the target's features
        self.precision: HeadPrecision | None = None  # what the head drafts in, and why (`build_eagle_drafter`)
        self._last: torch.Tensor | None = None  # o_{L−2} [B, 1, H] of the latest catch-up
        self._forwards = 0
        self._embedding_rows = head.embedding_rows()

    @property
    def forward_count(self) -> int:
        return self._forwards

    # --- the head on columns ----------------------------------------------------------------------------------

    def _positions(self, start: int, width: int, pad: torch.Tensor) -> torch.Tensor:
        columns = torch.arange(start, start + width, device=pad.device)
        return (columns[None, :] - pad[:, None]).clamp(min=0)  # [B, width]

    def _run(
        self, slots: Slots, start: int, width: int, hidden: torch.Tensor | None, slot: int | None = None
    ) -> torch.Tensor:
        """Head outputs o [B, width, H] for columns [start, start + width) of every row (or [1, width, H] of the row at
        `slot` alone): tokens from the slots' next columns, hidden states `hidden` [B, width, H] or, when None, fc of
        the target's features (zero in the padding)."""
        cache = self.cache
        rows = slice(None) if slot is None else slice(slot, slot + 1)
        pad = cache.pad(slot)  # [B] or [1]
        tokens = slots.ids[rows, start + 1 : start + width + 1].clamp(0, self._embedding_rows - 1)  # [B, width]
        if hidden is None:
            features = self.store.values[rows, start : start + width]  # [B, width, 3 H_t]
            columns = torch.arange(start, start + width, device=features.device)
            outside_pad = (columns[None, :] >= pad[:, None])[..., None]  # [B, width, 1]
            hidden = self.head.fuse(torch.where(outside_pad, features, torch.zeros((), dtype=features.dtype)))
        with torch.inference_mode():
            out = self.head(tokens, hidden, self._positions(start, width, pad), cache.attend_at(start, slot))
        self._forwards += 1
        return out

    def _choose(
        self, slots: Slots, column: int, output: torch.Tensor, selector: TokenSelector, generator
    ) -> torch.Tensor | None:
        """Write the draft token for `column` from the head output o [B, 1, H]; return its q [B, 1, V] (sampling)."""
        with torch.inference_mode():
            logits = self.head.target_logits(self.head.draft_logits(output), self.vocab_size)  # [B, 1, V]
        context, rows = slots.through(column), slots.row_starts()
        if selector.do_sample:
            q = selector.probabilities(logits, context, rows)  # [B, 1, V]
            slots.write_draft(column, sample(q, generator)[:, 0])
            return q
        slots.write_draft(column, selector.greedy(logits, context, rows)[:, 0])
        return None

    # --- the Drafter protocol ---------------------------------------------------------------------------------

    def prefill(self, slots: Slots) -> None:
        """Allocate the head's cache and run it over the committed columns the target has features for."""
        if self.store.missing is not None:
            return
        head = self.head
        self.cache = HeadCache(
            slots.ids.shape[0], head.config.num_key_value_heads, head.config.attention_head_dim, slots.capacity,
            slots.padding, self.static_shapes, head.compute_dtype, head.compute_device,
        )  # fmt: skip
        self.exact = 0
        end = slots.length - 1
        if end > 0:
            self._last = self._run(slots, 0, end, None)[:, -1:]  # o_{L−2}: the first proposal starts from it
            self.cache.length = self.exact = end

    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        if self.store.missing is not None:  # no features: the draft stops, the call goes on (it only changes speed)
            self.stopped = f"drafting stopped after {slots.length} columns: {self.store.missing}"
            if not self.static_shapes:
                return Proposal(0)
            return fill_proposal(slots, [0] * slots.ids.shape[0], gamma, self.vocab_size, selector.do_sample)
        length = slots.length  # L
        if self.target.length < length - 1:
            raise RuntimeError(f"the target has features for {self.target.length} columns, the head needs {length - 1}")
        start = self.cache.length  # c
        width = length - 1 - start  # the catch-up: n + 1 columns after a round, none right after the prefill
        if width > 0:
            fed = width
            if self.static_shapes:
                if width > gamma + 1:
                    raise RuntimeError(f"static shapes: an EAGLE catch-up of {width} columns > γ + 1 = {gamma + 1}")
                fed = gamma + 1  # columns past L − 1 are filler: overwritten before anything reads them
            self._last = self._run(slots, start, fed, None)[:, width - 1 : width]
            self.cache.length = self.exact = length - 1
        hidden = self._last  # o_{L−2} [B, 1, H]
        distributions = []
        for i in range(gamma):
            q = self._choose(slots, length + i, hidden, selector, generator)
            if q is not None:
                distributions.append(q)
            if i + 1 < gamma:  # feed (x_{i+1}, o) at column L − 1 + i
                hidden = self._run(slots, length - 1 + i, 1, hidden)
                self.cache.length = length + i
        return Proposal(gamma, torch.cat(distributions, dim=1) if distributions else None)

    def rollback(self, slots: Slots) -> None:
        """Keep the columns computed from the target's features; the self-fed ones are recomputed."""
        if self.cache is not None:
            self.cache.length = min(self.cache.length, self.exact, slots.length - 1)

    def move_rows(self, move: RowMove, slots: Slots) -> None:
        """Batches: features and the head's cache move with the rows (`engine.realign`)."""
        self.store.move_rows(move)
        if self.cache is None:
            return
        kept = min(self.cache.length, self.exact)
        kept = max(0, min(slots.length - 1, kept + min(move.shifts)))
        self.cache.move_rows(move, kept)
        self.exact = kept

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        """Queues: the target's one-row pass over the joining prompt handed its features over (`FeatureStore.
        capture_row`); the head's cache takes the row's columns [pad, c) that every other row holds (c: the cache's
        length) from one head pass over the row alone. Between rounds c < L − 1, so the next proposal's catch-up
        computes the rest, o_{L−2} included, for every row; before the head's first prefill there is nothing to do."""
        cache = self.cache
        if cache is None or cache.length <= slots.padding.host[slot]:
            return
        pad = slots.padding.host[slot]
        self._run(slots, pad, cache.length - pad, None, slot)

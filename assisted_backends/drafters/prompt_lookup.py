"""Prompt lookup drafting: no draft model, the context itself is the draft.

For n = max_ngram down to min_ngram: take the last n committed tokens x_{L-n..L-1}; find the *latest*
earlier position i with x_{i..i+n-1} equal to them and propose what followed, x_{i+n..i+n+γ-1}
(clipped at the committed end); in a batch each row looks up in its own tokens. The drafter asks for a
match of at least 2 tokens: a single repeated token ("the", a comma) in free text predicts the next
ones about as well as chance, and each such proposal costs a wider verify pass (the figures: benchmarks/
RESULTS.md, "Why the code is the way it is"). The drafter is
deterministic, so when sampling q is a point mass on each proposed token and the lossless rule accepts
token x with probability p(x).
"""

from __future__ import annotations

import torch

from assisted_backends.drafters.base import fill_proposal
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.slots import Slots

DEFAULT_MAX_NGRAM = 3
DEFAULT_MIN_NGRAM = 2


def lookup(ids: torch.Tensor, max_ngram: int, count: int, min_ngram: int = 1) -> torch.Tensor:
    """Continuation [≤ count] of the latest earlier match of the longest matching suffix n-gram of `ids` [L]
    (n from max_ngram down to min_ngram)."""
    length = ids.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = ids[length - n :]  # [n]
        windows = ids[: length - 1].unfold(0, n, 1)  # [L - n, n]; start i keeps i + n <= L - 1
        starts = (windows == pattern).all(dim=1).nonzero()
        if starts.numel():
            begin = int(starts[-1, 0]) + n
            return ids[begin : begin + count]
    return ids[:0]


class PromptLookupDrafter(Drafter):
    """Proposes up to γ tokens copied from the context; with `fixed_length` always exactly γ.

    Under fixed length a short (or missing) match is filled up by repeating the last token (a
    point mass like the rest: correctness never depends on what is proposed).
    """

    name = "prompt_lookup"

    def __init__(
        self,
        vocab_size: int,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        fixed_length: bool = False,
        min_ngram: int | None = None,  # None: DEFAULT_MIN_NGRAM
    ) -> None:
        min_ngram = DEFAULT_MIN_NGRAM if min_ngram is None else min_ngram
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.fixed_length = fixed_length

    @property
    def forward_count(self) -> int:
        return 0

    def prefill(self, slots: Slots) -> None:
        return None

    def rollback(self, slots: Slots) -> None:
        return None  # stateless: every proposal reads the committed tokens afresh

    def move_rows(self, move: RowMove, slots: Slots) -> None:
        return None  # stateless: each row's tokens are read where the slots hold them

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        return None  # stateless: the joining row's prompt is read at the next proposal

    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        start = slots.length
        prefixes = slots.row_starts()
        starts = prefixes.starts if prefixes is not None else [0]
        found = [
            lookup(slots.ids[b, first:start], self.max_ngram, gamma, self.min_ngram) for b, first in enumerate(starts)
        ]
        count = gamma if self.fixed_length else max(match.shape[0] for match in found)
        for b, match in enumerate(found):
            slots.write_draft(start, match, slot=b)
        written = [match.shape[0] for match in found]  # a row with a shorter match repeats its last token
        return fill_proposal(slots, written, count, self.vocab_size, selector.do_sample)

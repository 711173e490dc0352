"""`SuffixDrafter`: suffix decoding (SuffixDecoding, arXiv 2411.04975) over earlier requests and the current one.

Each round, for each row: index the row's newly committed tokens in its own automaton (positions mode), then
take two candidates, (1) the continuation of the longest suffix of the row's context that ended earlier in the
row itself (its latest occurrence, as prompt lookup copies), (2) the most frequent continuation of the longest
suffix found in the shared `SuffixCache` of earlier requests, scored by counts. The longer match wins (a tie
goes to the row's own copy). The tokens proposed grow with the match: at most min(γ, ⌈factor·m⌉) for a match of
m tokens, and a cache continuation stops once its estimated probability Π count(child)/count(parent) falls below
`min_probability`. A match shorter than `min_match` proposes nothing, so the round is a plain one: an open-ended
prompt that never matches decodes plainly, and the adaptive schedule prices the rest like any free drafter.

The drafter is deterministic: when sampling, q is a point mass on each proposed token (as for prompt lookup), so
the lossless rule accepts x with probability p(x) and the output keeps the target's distribution.
The finished requests enter the cache from the entry points (`api.generation`), never from inside a round.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from assisted_backends.drafters.base import fill_proposal
from assisted_backends.drafters.suffix.automaton import SuffixAutomaton
from assisted_backends.drafters.suffix.cache import MATCH_WINDOW, NO_CONTINUATION, Continuation, SuffixCache
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.slots import Slots
from assisted_backends.engine.token_tree import TokenTree

DEFAULT_SPEC_FACTOR = 1.0  # tokens proposed per matched token (the match length scales the speculation)
DEFAULT_MIN_PROBABILITY = 0.1  # SuffixDecoding's and vLLM's default
DEFAULT_MIN_MATCH = 2  # as prompt lookup: a one-token match predicts little
DEFAULT_TREE_WIDTH = 3  # token trees: the competing first tokens tried
DEFAULT_TREE_EXTRA = 4  # token trees: nodes beyond the chain's


class _Row:
    """One row's own tokens, indexed as they are committed."""

    def __init__(self) -> None:
        self.index = SuffixAutomaton(positions=True)
        self.index.start_sequence()

    @property
    def seen(self) -> int:
        return self.index.indexed

    def own_continuation(self, limit: int, min_match: int) -> Continuation:
        state, matched = self.index.current_match()
        if matched < min_match:
            return NO_CONTINUATION
        begin = self.index.latest[state] + 1
        if begin <= 0:
            return NO_CONTINUATION
        tokens = self.index.tokens[begin : min(begin + limit, len(self.index.tokens))].tolist()
        return Continuation(matched, tokens, [1.0] * len(tokens))


class SuffixDrafter(Drafter):
    """Proposes up to γ tokens from the longest earlier match (the row's own tokens or `cache`); with
    `fixed_length` always exactly γ (a short proposal filled up by repeating its last token)."""

    name = "suffix"

    def __init__(
        self,
        vocab_size: int,
        cache: SuffixCache | None,
        fixed_length: bool = False,
        spec_factor: float = DEFAULT_SPEC_FACTOR,
        min_probability: float = DEFAULT_MIN_PROBABILITY,
        min_match: int = DEFAULT_MIN_MATCH,
        token_trees: bool | None = None,
        tree_width: int = DEFAULT_TREE_WIDTH,
        tree_extra: int = DEFAULT_TREE_EXTRA,
    ) -> None:
        self.token_trees = bool(getattr(cache, "token_trees", False)) if token_trees is None else token_trees
        self.tree_width = tree_width
        self.tree_extra = tree_extra
        self.trees = 0  # proposals that carried a token tree
        self.vocab_size = vocab_size
        self.cache = cache
        self.fixed_length = fixed_length
        self.spec_factor = spec_factor
        self.min_probability = min_probability
        self.min_match = min_match
        self.rows: list[_Row] = []
        self.rounds = {"own": 0, "cache": 0, "none": 0}  # where each row's proposals came from
        self.proposed = 0

    @property
    def forward_count(self) -> int:
        return 0

    def prefill(self, slots: Slots) -> None:
        self.rows = [_Row() for _ in range(slots.ids.shape[0])]
        self._catch_up(slots)

    def rollback(self, slots: Slots) -> None:
        return None  # only committed tokens are ever indexed

    def move_rows(self, move: RowMove, slots: Slots) -> None:
        """Follow the kept rows; a row kept twice (a live queue's batch growing by copies of row 0) gets a state of
        its own, which the prompt joining there replaces (`insert_row`)."""
        kept, seen = [], set()
        for b in move.kept:
            kept.append(self.rows[b] if b not in seen else _Row())
            seen.add(b)
        self.rows = kept

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        self.rows[slot] = _Row()  # its prompt is read at the next proposal, with its first token

    def _catch_up(self, slots: Slots) -> None:
        """Index every row's tokens committed since the last round."""
        for b, row in enumerate(self.rows):
            begin = slots.padding.host[b] + row.seen
            if begin < slots.length:
                for token in slots.ids[b, begin : slots.length].tolist():
                    row.index.extend(token)

    def limit(self, gamma: int) -> Callable[[int], int]:
        """Tokens proposed after a match of m tokens: min(γ, ⌈factor·m⌉), at least one."""
        return lambda matched: max(1, min(gamma, math.ceil(self.spec_factor * matched)))

    def matches(self, slots: Slots) -> bool:
        """Whether every row has a proposal now (`drafters.eagle.combined`: the suffix match first, else the head)."""
        if not self.rows:
            self.prefill(slots)
        self._catch_up(slots)
        return all(self.choose(row, slots.capacity, count=False).tokens for row in self.rows)

    def choose(self, row: _Row, gamma: int, count: bool = True) -> Continuation:
        """The row's proposal: the longer match of its own tokens and the cache (a tie: its own)."""
        limit = self.limit(gamma)
        own = row.own_continuation(limit(row.index.current_match()[1]), self.min_match)
        cached = NO_CONTINUATION
        if self.cache is not None:
            context = row.index.tokens[-MATCH_WINDOW:].tolist()
            cached = self.cache.continuation(context, limit, self.min_probability)
            if cached.matched < self.min_match:
                cached = NO_CONTINUATION
        from_cache = bool(cached.tokens) and cached.matched > own.matched
        if count:
            self.rounds["cache" if from_cache else ("own" if own.tokens else "none")] += 1
        return cached if from_cache else own

    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        self._catch_up(slots)
        start = slots.length
        room = slots.capacity - start
        chosen = [self.choose(row, gamma) for row in self.rows]
        found = [continuation.tokens[:room] for continuation in chosen]
        count = min(gamma, room) if self.fixed_length else max(len(tokens) for tokens in found)
        for b, tokens in enumerate(found):
            if tokens:
                slots.write_draft(start, torch.tensor(tokens, dtype=slots.ids.dtype), slot=b)
        written = [len(tokens) for tokens in found]
        self.proposed += count
        proposal = fill_proposal(slots, written, count, self.vocab_size, selector.do_sample)
        if self.token_trees and len(self.rows) == 1 and not self.fixed_length and found[0]:
            chain_expected = sum(chosen[0].probabilities[: len(found[0])])
            grown = self.tree(self.rows[0], found[0], min(gamma, room))
            if grown is not None:
                proposal.tree, extra = grown
                proposal.tree_expected = (chain_expected, chain_expected + extra)
                self.trees += 1
        return proposal

    def tree(self, row: _Row, chain: list[int], depth: int) -> tuple[TokenTree, float] | None:
        """Token trees: `chain` (nodes 0..k−1) plus the competing continuations the row's own tokens and the cache
        offer (`SuffixCache.branches`), at most `tree_extra` nodes more and `depth` deep, and the tokens its added
        nodes are expected to add (their estimated probabilities summed; the row's own copy counts 1 a token); None
        when nothing competes."""
        limit = self.limit(depth)
        paths: list[tuple[list[int], list[float]]] = []
        own = row.own_continuation(limit(row.index.current_match()[1]), self.min_match).tokens
        if own:
            paths.append((own, [1.0] * len(own)))
        if self.cache is not None:
            context = row.index.tokens[-MATCH_WINDOW:].tolist()
            paths += self.cache.branches(context, chain, self.tree_width, limit, self.min_probability)
        tree, kept, extra = TokenTree.from_paths([chain]), [chain], 0.0
        for path, chances in paths:
            new_at = len(path) - len(chances)  # chances cover the path's last tokens
            path = path[:depth]
            while path:
                candidate = TokenTree.from_paths(kept + [path])
                if candidate.size <= len(chain) + self.tree_extra:
                    break
                path = path[:-1]
            if not path or candidate.size == tree.size:
                continue
            added = candidate.size - tree.size  # new nodes: the path's last `added` tokens
            extra += sum(chances[max(0, len(path) - added - new_at) : len(path) - new_at])
            kept.append(path)
            tree = candidate
        return (tree, extra) if tree.size > len(chain) else None

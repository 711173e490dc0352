"""`SuffixCache`: the index of earlier requests a suffix drafter matches against, bounded in memory.

Requests (each one's prompt followed by its committed output) go into suffix automata (`automaton`), in
*segments* of about `segment_tokens` tokens: the newest segment takes requests until it is full, then a new one
opens. When the tokens held pass `max_tokens`, the oldest segment is dropped whole (its requests are the oldest),
so memory stays within about `max_tokens` tokens' worth of index (`nbytes` reports it) and matching costs one
lookup per segment. Indexing a request costs time linear in its length (`index_seconds` / `indexed_tokens`).

One cache can serve many calls and many batch rows: pass the same object as `suffix_cache=` to every `generate`
call (or give it to an `AssistedGenerator`, a queue, a CLI run). It only ever changes speed: the tokens are the
target's whatever it holds, so a cache filled by another model or tokenizer is merely useless, never wrong.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from assisted_backends.drafters.suffix.automaton import SuffixAutomaton
from assisted_backends.options.errors import OptionTypeError
from assisted_backends.options.fields import SUFFIX_CACHE_VALUES

DEFAULT_MAX_TOKENS = 1 << 20  # ~1M tokens of requests (~60 MB of index at the measured ~59 bytes per token)
DEFAULT_SEGMENT_TOKENS = 1 << 17
MATCH_WINDOW = 32  # the context tokens a match is searched in (the longest match counted)


@dataclass(frozen=True)
class Continuation:
    """What an index offers after the current context: the matched suffix's length `matched`, the tokens that
    followed it most often, and the estimated probability of each prefix of them (a running product)."""

    matched: int
    tokens: list[int]
    probabilities: list[float]

    @property
    def score(self) -> float:
        """Expected tokens accepted if the target agreed with the counts: Σ_k P(first k tokens)."""
        return sum(self.probabilities)


NO_CONTINUATION = Continuation(0, [], [])


class SuffixCache:
    """Earlier requests' tokens, indexed for the longest-suffix match (see the module docstring)."""

    def __init__(
        self, max_tokens: int = DEFAULT_MAX_TOKENS, segment_tokens: int | None = None, token_trees: bool = False
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"SuffixCache(max_tokens=...) must be an int >= 1, got {max_tokens!r}")
        if not isinstance(token_trees, bool):
            raise ValueError(f"SuffixCache(token_trees=...) must be True or False, got {token_trees!r}")
        self.token_trees = token_trees  # drafters over this cache may propose token trees (one row only)
        self.max_tokens = max_tokens
        self.segment_tokens = max(1, segment_tokens or min(DEFAULT_SEGMENT_TOKENS, max(max_tokens // 8, 1)))
        self.segments: list[SuffixAutomaton] = []
        self.requests = 0  # added, evicted ones included
        self.evicted_requests = 0
        self.index_seconds = 0.0
        self.indexed_tokens = 0
        self._lock = threading.Lock()  # a server's threads may add while another call drafts

    @property
    def tokens(self) -> int:
        """Tokens held (evicted requests excluded)."""
        return sum(segment.indexed for segment in self.segments)

    @property
    def held_requests(self) -> int:
        return sum(segment.sequences for segment in self.segments)

    def add(self, tokens: Iterable[int]) -> None:
        """Index one finished request (its prompt, then its output) as one sequence; evict the oldest segments
        past `max_tokens`."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            return
        began = time.perf_counter()
        with self._lock:
            if not self.segments or self.segments[-1].indexed >= self.segment_tokens:
                self.segments.append(SuffixAutomaton())
            self.segments[-1].add(tokens)
            self.requests += 1
            while len(self.segments) > 1 and self.tokens > self.max_tokens:
                self.evicted_requests += self.segments.pop(0).sequences
        self.index_seconds += time.perf_counter() - began
        self.indexed_tokens += len(tokens)

    def continuation(self, context: list[int], limit: Callable[[int], int], min_probability: float) -> Continuation:
        """The best continuation any segment offers after `context`'s longest matched suffix (the longest match
        first, then the higher score), at most `limit(matched)` tokens."""
        window = context[-MATCH_WINDOW:]
        best = NO_CONTINUATION
        with self._lock:
            for segment in reversed(self.segments):  # newest first: ties go to recent requests
                state, matched = segment.match(window)
                if matched == 0 or matched < best.matched:
                    continue
                tokens, probabilities = segment.best_continuation(state, limit(matched), min_probability)
                found = Continuation(matched, tokens, probabilities)
                if tokens and (matched > best.matched or found.score > best.score):
                    best = found
        return best

    def branches(
        self, context: list[int], chain: list[int], width: int, limit: Callable[[int], int], min_probability: float
    ) -> list[tuple[list[int], list[float]]]:
        """Token trees: the continuations competing with `chain` after `context`'s longest matched suffix, in the
        newest segment holding that match (`SuffixAutomaton.branches`: each path, and the estimated probabilities of
        its tokens past the chain), at most `limit(matched)` tokens each, the likeliest first."""
        window = context[-MATCH_WINDOW:]
        best: tuple[int, SuffixAutomaton | None, int] = (0, None, -1)
        with self._lock:
            for segment in reversed(self.segments):
                state, matched = segment.match(window)
                if matched > best[0]:
                    best = (matched, segment, state)
            matched, segment, state = best
            if segment is None:
                return []
            return segment.branches(state, chain, width, limit(matched), min_probability)

    def nbytes(self) -> int:
        """Bytes the index holds (`SuffixAutomaton.nbytes` summed)."""
        with self._lock:
            return sum(segment.nbytes() for segment in self.segments)

    def summary(self) -> dict[str, float]:
        """Held requests and tokens, bytes, and indexing time (total and per token)."""
        return {
            "requests": self.held_requests,
            "evicted_requests": self.evicted_requests,
            "tokens": self.tokens,
            "bytes": self.nbytes(),
            "index_s": self.index_seconds,
            "index_us_per_token": 1e6 * self.index_seconds / max(self.indexed_tokens, 1),
        }


_PER_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # suffix_cache=True: one cache per target


def cache_for(value: Any, model: Any) -> SuffixCache | None:
    """The cache `suffix_cache=value` names: the object itself, the one this process keeps for `model` (True), or
    None (None/False: no suffix drafting)."""
    if value is None or value is False:
        return None
    if isinstance(value, SuffixCache):
        return value
    if value is True:
        cache = _PER_MODEL.get(model)
        if cache is None:
            cache = _PER_MODEL[model] = SuffixCache()
        return cache
    raise OptionTypeError(f"{{name}} got {type(value).__name__} {value!r}: {SUFFIX_CACHE_VALUES}", name="suffix_cache")

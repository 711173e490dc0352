"""The suffix drafter's index (`drafters.suffix`): longest matches, document counts, continuations, the current
request's latest occurrence, eviction, the memory bound and linear indexing, each against a brute-force reference."""

from __future__ import annotations

import random

import pytest
import torch

from assisted_backends.drafters.suffix.automaton import SuffixAutomaton
from assisted_backends.drafters.suffix.cache import SuffixCache, cache_for
from assisted_backends.drafters.suffix.drafter import SuffixDrafter
from assisted_backends.engine.sampling import SamplingConfig, TokenSelector
from assisted_backends.engine.slots import Slots
from assisted_backends.options.errors import OptionError


def _occurs(text: list[int], pattern: list[int]) -> bool:
    return any(text[i : i + len(pattern)] == pattern for i in range(len(text) - len(pattern) + 1))


def _longest_match(texts: list[list[int]], context: list[int]) -> int:
    longest = 0
    for m in range(1, len(context) + 1):
        if not any(_occurs(text, context[-m:]) for text in texts):
            break
        longest = m
    return longest


def _random_texts(rng: random.Random, alphabet: int) -> list[list[int]]:
    return [[rng.randrange(alphabet) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 6))]


@pytest.mark.parametrize("alphabet", [3, 20])  # 20: states past WIDE transitions keep them in a dict
def test_the_match_is_the_longest_suffix_that_occurs_and_counts_are_documents(alphabet):
    rng = random.Random(alphabet)
    for _ in range(300):
        texts = _random_texts(rng, alphabet)
        index = SuffixAutomaton()
        for text in texts:
            index.add(text)
        context = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 15))]
        state, matched = index.match(context)
        assert matched == _longest_match(texts, context), (texts, context)
        if matched == 0:
            continue
        suffix = context[-matched:]
        assert index.count[state] == sum(_occurs(text, suffix) for text in texts)
        for token, child in index.children(state):
            assert index.count[child] == sum(_occurs(text, suffix + [token]) for text in texts)


def test_the_continuation_follows_the_most_frequent_next_token_while_likely_enough():
    index = SuffixAutomaton()
    for text in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7, 8], [9, 9]):
        index.add(text)
    state, matched = index.match([0, 1, 2])
    assert matched == 2 and index.count[state] == 3
    tokens, probabilities = index.best_continuation(state, limit=10, min_probability=0.1)
    assert tokens == [3, 4, 5]  # 3 in 3/3 documents, then 4 in 2/3, then a tie 5/6 in 1/3 each (the lower id)
    assert probabilities == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert index.best_continuation(state, limit=10, min_probability=0.5)[0] == [3, 4]  # 1/3 < 0.5: stop
    assert index.best_continuation(state, limit=1, min_probability=0.1)[0] == [3]


def test_the_current_requests_match_names_its_latest_earlier_occurrence():
    rng = random.Random(1)
    for _ in range(300):
        tokens = [rng.randrange(3) for _ in range(rng.randrange(2, 40))]
        index = SuffixAutomaton(positions=True)
        index.start_sequence()
        for token in tokens:
            index.extend(token)
        state, matched = index.current_match()
        n = len(tokens)
        ends = {m: [i + m - 1 for i in range(n - m) if tokens[i : i + m] == tokens[n - m :]] for m in range(1, n)}
        longest = max((m for m, found in ends.items() if found), default=0)
        assert matched == longest, tokens
        if matched:
            assert index.latest[state] == max(ends[matched])


def test_the_cache_evicts_its_oldest_requests_and_stays_within_its_bound():
    rng = random.Random(2)
    cache = SuffixCache(max_tokens=2000, segment_tokens=500)
    first = [rng.randrange(1000) for _ in range(100)]
    cache.add(first)
    assert cache.continuation(first[:50], lambda m: 5, 0.1).tokens == first[50:55]
    for _ in range(100):
        cache.add([rng.randrange(1000) for _ in range(100)])
    assert cache.tokens <= 2000 and cache.evicted_requests > 0
    assert cache.held_requests + cache.evicted_requests == cache.requests == 101
    assert cache.continuation(first[:50], lambda m: 5, 0.1).matched < 50  # the first request is gone
    assert 0 < cache.nbytes() <= 150 * 2000, cache.nbytes()  # the bytes held follow the tokens held
    summary = cache.summary()
    assert summary["tokens"] == cache.tokens and summary["index_us_per_token"] > 0


@pytest.mark.parametrize(
    "texts",
    [
        [[7] * 4000],  # one token repeated: the deepest suffix-link chains
        [list(range(1000))] * 4,  # the same request four times
        [[random.Random(3).randrange(4) for _ in range(4000)]],  # a tiny alphabet: many branching states
        [[(i * 7919) % 50 for i in range(j, j + 800)] for j in range(5)],  # overlapping shifted copies
    ],
)
def test_indexing_is_linear_in_the_tokens(texts):
    index = SuffixAutomaton()
    for text in texts:
        index.add(text)
    tokens = sum(len(text) for text in texts)
    assert len(index.length) <= 2 * tokens + 1  # states
    assert index.work <= 6 * tokens, (index.work, tokens)  # construction and counting steps together


def _proposed(drafter: SuffixDrafter, ids: list[int], gamma: int = 6) -> list[int]:
    slots = Slots(torch.tensor([ids]), len(ids) + 16, 0, [0], 0)
    drafter.prefill(slots)
    count = drafter.propose(slots, gamma, TokenSelector(SamplingConfig()), None).count
    return slots.ids[0, len(ids) : len(ids) + count].tolist()


def test_the_drafter_takes_the_longer_match_and_scales_the_length_with_it():
    cache = SuffixCache()
    cache.add([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    assert _proposed(SuffixDrafter(32, cache), [20, 3, 4]) == [5, 6]  # a 2-token match: 2 tokens
    assert _proposed(SuffixDrafter(32, cache), [1, 2, 3, 4], gamma=3) == [5, 6, 7]  # 4 matched: up to γ
    assert _proposed(SuffixDrafter(32, cache, spec_factor=2.0), [20, 3, 4]) == [5, 6, 7, 8]  # 2·2 tokens
    assert _proposed(SuffixDrafter(32, cache), [20, 21, 4]) == []  # one token matched: nothing, a plain round
    assert _proposed(SuffixDrafter(32, None), [5, 1, 2, 9, 8, 1, 2]) == [9, 8]  # its own tokens
    # its own "2 3" -> "9 8 ..." (2 tokens matched) against the cache's "1 2 3" -> "4 5 ..." (3): the longer wins
    assert _proposed(SuffixDrafter(32, cache), [5, 2, 3, 9, 8, 1, 2, 3]) == [4, 5, 6]
    # its own "1 2" -> "9 8 3 1" against the cache's "1 2" -> "3 4 ...": a tie goes to the request's own tokens
    assert _proposed(SuffixDrafter(32, cache), [5, 1, 2, 9, 8, 3, 1, 2]) == [9, 8]


def test_suffix_cache_values_are_checked():
    model = torch.nn.Linear(1, 1)
    cache = SuffixCache()
    assert cache_for(cache, model) is cache and cache_for(None, model) is None and cache_for(False, model) is None
    assert cache_for(True, model) is cache_for(True, model)  # one per target, kept by the process
    assert cache_for(True, model) is not cache_for(True, torch.nn.Linear(1, 1))
    with pytest.raises(OptionError, match="suffix_cache got int 5: pass True"):
        cache_for(5, model)
    with pytest.raises(ValueError, match="max_tokens"):
        SuffixCache(max_tokens=0)


def test_rows_follow_moves_and_a_row_kept_twice_gets_its_own_state():
    from assisted_backends.engine.realign import RowMove

    drafter = SuffixDrafter(32, None)
    slots = Slots(torch.tensor([[1, 2, 3], [4, 5, 6]]), 8, 0, [0, 0], 0)
    drafter.prefill(slots)
    first, second = drafter.rows
    drafter.move_rows(RowMove(None, torch.zeros(3, dtype=torch.long), (0, 0, 0), (1, 0, 0)), slots)
    assert drafter.rows[0] is second and drafter.rows[1] is first
    assert drafter.rows[2] is not first and drafter.rows[2].seen == 0  # a queue's grown slot: fresh

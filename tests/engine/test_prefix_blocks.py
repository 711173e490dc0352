"""`engine.prefix_cache.PrefixCache`: prefixes matched by whole blocks, partial blocks never matched, least recently
used blocks evicted first within the byte bound, salts keeping tenants apart, and a store reading only the positions
it is given (a rolled-back tail is never among them)."""

from __future__ import annotations

import pytest
import torch

from assisted_backends.engine.prefix_cache import PrefixCache

LAYERS, HEADS, DIM = 2, 1, 4


def kv_of(tokens: list[int]):
    """A fake model's keys and values: position i of `tokens` holds token i's value everywhere (so a restored block
    shows which tokens it came from); `read(begin, end)` records what it was asked for."""
    asked = []

    def read(begin: int, end: int) -> torch.Tensor:
        asked.append((begin, end))
        values = torch.tensor(tokens[begin:end], dtype=torch.float32)
        return values[None, None, None, :, None].expand(LAYERS, 2, HEADS, end - begin, DIM).clone()

    read.asked = asked
    return read


def block_bytes(block_tokens: int) -> int:
    return LAYERS * 2 * HEADS * block_tokens * DIM * 4


def test_a_prefix_matches_by_whole_blocks_and_restores_its_own_values():
    cache = PrefixCache(block_tokens=4)
    first = list(range(10, 21))  # 11 tokens: two full blocks, a partial one not stored
    assert cache.store(first, kv_of(first)) == 2
    assert cache.blocks == 2 and cache.nbytes == 2 * block_bytes(4)
    asked = first[:9] + [99, 98]  # shares 9 tokens: two blocks (8 tokens)
    match = cache.match(asked)
    assert match.length == 8
    assert match.kv()[0, 0, 0, :, 0].tolist() == [float(t) for t in first[:8]]
    assert cache.match(first[:3] + [5] * 8).length == 0  # a partial first block matches nothing
    assert cache.match(first[:4] + [5] * 8).length == 4
    assert cache.match(first, limit=7).length == 4  # never past the limit (the last prompt token is computed)


def test_a_block_is_named_by_everything_before_it():
    """The same four tokens after a different first block are another block (the chained hash)."""
    cache = PrefixCache(block_tokens=4)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    cache.store(tokens, kv_of(tokens))
    assert cache.match([9, 9, 9, 9, 5, 6, 7, 8]).length == 0
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 0]).length == 4


def test_storing_again_reads_only_the_new_blocks():
    cache = PrefixCache(block_tokens=4)
    prompt = list(range(8))
    cache.store(prompt, kv_of(prompt))
    answer = prompt + [50, 51, 52, 53, 54]
    read = kv_of(answer)
    assert cache.store(answer, read) == 1
    assert read.asked == [(8, 12)]


def test_only_the_positions_stored_are_ever_read():
    """A row's store covers its committed tokens: a rolled-back draft tail past them is never read, so never
    restored (`engine.prefix_reuse.keep_finished` passes the committed tokens only)."""
    cache = PrefixCache(block_tokens=2)
    committed, rolled_back = [1, 2, 3, 4], [7, 7]
    buffer = committed + rolled_back  # what a row's columns hold after a round that rejected two drafts
    read = kv_of(buffer)
    cache.store(committed, read)
    assert max(end for _, end in read.asked) <= len(committed)
    assert cache.match(committed + [7, 7, 0]).length == 4  # the tail was never stored


def test_eviction_drops_the_least_recently_used_blocks_within_the_byte_bound():
    cache = PrefixCache(max_bytes=3 * block_bytes(2), block_tokens=2)
    a, b = [1, 1, 2, 2], [3, 3, 4, 4]
    cache.store(a, kv_of(a))
    cache.store(b, kv_of(b))  # four blocks > three: one goes
    assert cache.nbytes <= cache.max_bytes and cache.blocks == 3 and cache.evicted_blocks == 1
    # a's chain lost its last block (children go before their parents), b is whole
    assert cache.match(a).length == 2
    assert cache.match(b).length == 4
    cache.match(a)  # a used again: b is now the least recently used
    c = [5, 5, 6, 6]
    cache.store(c, kv_of(c))
    assert cache.nbytes <= cache.max_bytes and cache.blocks == 3
    assert cache.match(c).length == 4
    assert cache.match(a).length == 2 and cache.match(b).length == 0


def test_a_block_larger_than_the_bound_is_not_kept():
    cache = PrefixCache(max_bytes=block_bytes(4) - 1, block_tokens=4)
    tokens = list(range(8))
    assert cache.store(tokens, kv_of(tokens)) == 0
    assert cache.nbytes == 0 and cache.match(tokens).length == 0


def test_salts_keep_tenants_apart():
    cache = PrefixCache(block_tokens=4)
    tokens = list(range(12))
    cache.store(tokens, kv_of(tokens), salt="tenant-a")
    assert cache.match(tokens, salt="tenant-a").length == 12
    assert cache.match(tokens, salt="tenant-b").length == 0
    assert cache.match(tokens).length == 0
    assert cache.scope("tenant-a").salt == "tenant-a"


def test_hit_rate_counts_the_tokens_restored():
    cache = PrefixCache(block_tokens=4)
    cache.record(100, 0)
    cache.record(100, 80)
    assert cache.lookups == 2 and cache.hit_rate == pytest.approx(0.4)


def test_one_cache_serves_one_model():
    cache = PrefixCache()
    first, second = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    cache.bind(first)
    cache.bind(first)
    with pytest.raises(ValueError, match="another model"):
        cache.bind(second)


@pytest.mark.parametrize("arguments", [dict(max_bytes=-1), dict(block_tokens=0), dict(max_bytes=True)])
def test_bad_arguments_are_one_clear_error(arguments):
    with pytest.raises(ValueError, match="PrefixCache"):
        PrefixCache(**arguments)


def test_a_finished_row_stores_its_committed_tokens_but_the_newest_and_no_draft():
    """`PrefixReuse.keep_finished`: a row whose newest committed token y sits at column end − 1, after a verify pass
    that also fed drafts past it (rejected: the cache holds their keys there), stores the columns before y only; the
    restored keys are those of the columns stored (here each key holds its column)."""
    from types import SimpleNamespace

    from transformers import DynamicCache

    from assisted_backends.engine.prefix_reuse import PrefixReuse

    pad, end, fed = 2, 13, 16  # tokens at [2, 13): y at column 12; drafts fed at [13, 16)
    ids = torch.tensor([[0, 0, *range(40, 50), 77, 91, 92, 93]])
    keys = torch.arange(fed, dtype=torch.float32)[None, None, :, None].expand(1, HEADS, fed, DIM)
    cache = DynamicCache()
    for layer in range(LAYERS):
        cache.update(keys.clone(), -keys.clone(), layer)
    layout = SimpleNamespace(cache=cache, length=fed, padding=SimpleNamespace(host=[pad]))
    slots = SimpleNamespace(ids=ids, padding=SimpleNamespace(host=[pad]))
    store = PrefixCache(block_tokens=1)
    PrefixReuse(store.scope(), layout).keep_finished(slots, 0, end)
    asked = ids[0, pad:].tolist()  # the committed tokens, y, then the drafts
    match = store.match(asked)
    assert match.length == end - 1 - pad  # y and the drafts after it never entered
    assert match.kv()[0, 0, 0, :, 0].tolist() == [float(column) for column in range(pad, end - 1)]

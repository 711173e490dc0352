"""Shape census under refill: a queue keeps static shapes in a bounded set (docs/design.md rule 8; `engine.joins`).

With `static_shapes=True` the slot count is the batch bucket B', and a prompt that joins runs its own pass
on one row, left-padded to its prompt bucket Pb on a one-row cache of Pb positions, before its keys and
values are written into the batch's cache; a prompt longer than the shared length moves the rows right
(a gather, not a new shape). So over queues of prompts of several buckets, every forward of the target
and the draft has a signature from this bound, per queue (C: the queue's cache bucket, from its longest
prompt):
- target: the first batch's prefill [B', Pb0] per (B', Pb0, C), one [1, Pb] pass per prompt bucket that
  joins, one verify [B', γ+1] per (B', C);
- draft: the same prefill and joining passes, at most two decode feeds (1 and 2 tokens) per (B', C).
Every prompt is also checked token for token against the target alone.
"""

from __future__ import annotations

import pytest
import torch
from test_batches import alone, prompts
from test_static_shape_census import BUCKET, GAMMA, Census, models

from assisted_backends import generate_queue
from assisted_backends.engine.kv_cache import bucketed

pytestmark = pytest.mark.usefixtures("one_thread")

QUEUES = {2: (3, 17, 33, 5, 45, 9), 3: (20, 5, 9, 40, 2, 12, 7)}  # slots -> prompt lengths (buckets 16..48)
TOKEN_COUNTS = (5, 22)


def test_a_refilled_batch_keeps_static_shapes_in_a_bounded_set():
    target, draft = models()
    cases = [(slots, lengths, count) for slots, lengths in QUEUES.items() for count in TOKEN_COUNTS]
    expected = {case: [alone(target, row, case[2]) for row in prompts(case[1])] for case in cases}
    census = Census(target=target, draft=draft)
    prefills, joins, verifies = set(), set(), set()
    try:
        for slots, lengths, count in cases:
            rows = prompts(lengths)
            result = generate_queue(
                target, rows, slots=slots, assistant_model=draft, max_new_tokens=count, pad_token_id=0,
                num_assistant_tokens=GAMMA, static_shapes=True, bucket_size=BUCKET, device="cpu",
            )  # fmt: skip
            for i, tokens in enumerate(expected[(slots, lengths, count)]):
                assert torch.equal(result.tokens[i], tokens), (slots, lengths, count, i)
            batch = 1 << (slots - 1).bit_length()
            assert result.stats.joins == len(lengths) - batch
            first = bucketed(max(lengths[:batch]), BUCKET)
            capacity = bucketed(max(first, max(lengths)) + count + GAMMA + 1, BUCKET)
            prefills.add((batch, first, capacity))
            joins.update(bucketed(n, BUCKET) for n in lengths[batch:])
            verifies.add((batch, capacity))
    finally:
        census.close()

    batch_sizes = {
        dict(signature)["input_ids"][0] for name in ("target", "draft") for signature in census.signatures[name]
    }
    assert batch_sizes == {1, 2, 4}, "a queue of 3 slots runs as 4; joining prompts run alone"
    feeds = {padded for _, padded, _ in prefills} | joins
    assert set(census.feed_lengths("target")) <= feeds | {GAMMA + 1}
    assert set(census.feed_lengths("draft")) <= feeds | {1, 2}
    target_bound = len(prefills) + len(joins) + len(verifies)
    draft_bound = len(prefills) + len(joins) + 2 * len(verifies)
    counts = {name: len(census.signatures[name]) for name in ("target", "draft")}
    assert counts["target"] <= target_bound and counts["draft"] <= draft_bound, (counts, target_bound, draft_bound)

"""Shape census under batching: static shapes survive batches (docs/design.md rule 8).

With `static_shapes=True` (the HPU policy; CUDA graphs) a batch is rounded up to a power of two
(copies of row 0 ride along unread), the prompt to a bucket, the cache to a bucket, and rows that
accepted different numbers of draft tokens are realigned by a gather, not by a new shape. So over
batches of 2, 3 and 4 prompts of several lengths and token counts, every forward of the target and the
draft has a signature from the bound of tests/engine/test_static_shape_census.py, per batch bucket:
- target: one prefill per (batch bucket, prompt bucket, cache bucket), one verify [B', γ+1] per
  (batch bucket, cache bucket);
- draft: one prefill per (batch bucket, prompt bucket, cache bucket), at most two decode feeds
  (1 and 2 tokens) per (batch bucket, cache bucket).
Every row is also checked token for token against the target alone.
"""

from __future__ import annotations

import pytest
import torch
from test_batches import alone, left_padded, prompts
from test_static_shape_census import BUCKET, GAMMA, Census, models

from assisted_backends import generate
from assisted_backends.engine.kv_cache import bucketed

pytestmark = pytest.mark.usefixtures("one_thread")

BATCHES = {2: (3, 17), 3: (20, 5, 9), 4: (33, 2, 12, 7)}  # batch size -> prompt lengths (buckets 16..48)
TOKEN_COUNTS = (5, 22)


def test_batched_static_shapes_stay_in_a_bounded_set():
    target, draft = models()
    cases = [(lengths, count) for lengths in BATCHES.values() for count in TOKEN_COUNTS]
    expected = {(lengths, count): [alone(target, row, count) for row in prompts(lengths)] for lengths, count in cases}
    census = Census(target=target, draft=draft)
    prefills, verifies = set(), set()
    try:
        for lengths, count in cases:
            ids, mask = left_padded(prompts(lengths))
            result = generate(
                target, ids, attention_mask=mask, assistant_model=draft, max_new_tokens=count, pad_token_id=0,
                num_assistant_tokens=GAMMA, static_shapes=True, bucket_size=BUCKET, device="cpu",
            )  # fmt: skip
            for b, tokens in enumerate(expected[(lengths, count)]):
                assert torch.equal(result.sequences[b, ids.shape[1] : ids.shape[1] + tokens.shape[0]], tokens)
            batch = 1 << (len(lengths) - 1).bit_length()
            padded = bucketed(ids.shape[1], BUCKET)
            capacity = bucketed(padded + count + GAMMA + 1, BUCKET)
            prefills.add((batch, padded, capacity))
            verifies.add((batch, capacity))
    finally:
        census.close()

    batch_sizes = {
        dict(signature)["input_ids"][0] for name in ("target", "draft") for signature in census.signatures[name]
    }
    assert batch_sizes == {2, 4}, "batches of 3 run as 4: the batch comes from a bounded set too"
    assert set(census.feed_lengths("target")) <= {padded for _, padded, _ in prefills} | {GAMMA + 1}
    assert set(census.feed_lengths("draft")) <= {padded for _, padded, _ in prefills} | {1, 2}
    assert len(census.signatures["target"]) <= len(prefills) + len(verifies)
    assert len(census.signatures["draft"]) <= len(prefills) + 2 * len(verifies)

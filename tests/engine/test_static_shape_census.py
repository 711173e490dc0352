"""Shape census: how many distinct input signatures reach each model's forward (= graphs an HPU compiles).

Forward pre-hooks record the shapes of every tensor argument (input_ids, attention_mask,
position_ids, cache_position) and of the KV cache tensors of every call of the target and the
draft over whole generations of several prompt lengths and token counts, with
`static_shapes=True` on the CPU backend: the policy the HPU backend always uses
(tests/backends/test_hpu_backend.py checks they are the same policy).

The bound, with bucket B, draft length γ, and per generation a prompt bucket Pb = ⌈P/B⌉·B and a
cache bucket C = ⌈(Pb + max_new_tokens + γ + 1)/B⌉·B (the static cache and its mask span C):
- target: one prefill signature per distinct (Pb, C) + one verify signature [1, γ+1] per C;
- draft:  one prefill signature per distinct (Pb, C) + at most two decode signatures per C (the
  one-token step, and the two-token catch-up feed after a round in which all γ were accepted).
Dynamic mode (no padding, growing cache, trimmed last draft) is expected to exceed that bound.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache

import pytest
import torch
from tiny_models import noisy_copy, random_prompt, reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.engine.kv_cache import bucketed

BUCKET = 16
GAMMA = 3
PROMPT_LENGTHS = (3, 17, 45)  # prompt buckets 16, 32, 48
TOKEN_COUNTS = (5, 20, 37)


@cache
def models():
    target = tiny_model("llama", seed=0)
    return target, noisy_copy(target, seed=3, scale=0.05)  # partial acceptance: every feed length occurs


@cache
def reference(prompt_length: int) -> torch.Tensor:
    return reference_greedy(models()[0], random_prompt(prompt_length, seed=prompt_length), max(TOKEN_COUNTS))


def _cache_shape(cache) -> tuple | None:
    """Shape of the first layer's key tensor: part of the graph too (None before a lazy cache is written)."""
    layers = getattr(cache, "layers", None)
    keys = getattr(layers[0], "keys", None) if layers else None
    if keys is None and getattr(cache, "key_cache", None):  # transformers 4.5x
        keys = cache.key_cache[0]
    return tuple(keys.shape) if torch.is_tensor(keys) else None


class Census:
    """Distinct tensor-argument signatures per model, recorded by forward pre-hooks."""

    def __init__(self, **named_models: torch.nn.Module) -> None:
        self.signatures: dict[str, set[tuple]] = defaultdict(set)
        self._handles = [
            model.register_forward_pre_hook(self._recorder(name), with_kwargs=True)
            for name, model in named_models.items()
        ]

    def _recorder(self, name: str):
        def hook(module, args, kwargs):
            tensors = [(key, tuple(value.shape)) for key, value in kwargs.items() if torch.is_tensor(value)]
            tensors += [(f"arg{i}", tuple(value.shape)) for i, value in enumerate(args) if torch.is_tensor(value)]
            cache = kwargs.get("cache", kwargs.get("past_key_values"))  # the argument's name from transformers 5.24 on
            tensors.append(("kv_cache", _cache_shape(cache)))
            self.signatures[name].add(tuple(sorted(tensors)))

        return hook

    def feed_lengths(self, name: str) -> dict[int, int]:
        """How many signatures feed how many tokens."""
        counts: dict[int, int] = defaultdict(int)
        for signature in self.signatures[name]:
            counts[dict(signature)["input_ids"][1]] += 1
        return dict(counts)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def run_census(static_shapes: bool) -> tuple[Census, dict[str, int]]:
    target, draft = models()
    references = {length: reference(length) for length in PROMPT_LENGTHS}  # before the hooks: not counted
    census = Census(target=target, draft=draft)
    prefill_buckets, cache_buckets = set(), set()
    try:
        for prompt_length in PROMPT_LENGTHS:
            for max_new_tokens in TOKEN_COUNTS:
                result = generate(
                    target,
                    random_prompt(prompt_length, seed=prompt_length),
                    assistant_model=draft,
                    max_new_tokens=max_new_tokens,
                    num_assistant_tokens=GAMMA,
                    static_shapes=static_shapes,
                    cache_layout=None if static_shapes else "dynamic",
                    bucket_size=BUCKET,
                    device="cpu",
                )
                expected = references[prompt_length][:, : prompt_length + max_new_tokens]
                assert torch.equal(result.sequences, expected), (static_shapes, prompt_length, max_new_tokens)
                padded = bucketed(prompt_length, BUCKET)
                capacity = bucketed(padded + max_new_tokens + GAMMA + 1, BUCKET)
                prefill_buckets.add((padded, capacity))
                cache_buckets.add(capacity)
    finally:
        census.close()
    bounds = {
        "target": len(prefill_buckets) + len(cache_buckets),
        "draft": len(prefill_buckets) + 2 * len(cache_buckets),
    }
    return census, bounds


@pytest.mark.slow
def test_static_shapes_bound_the_signatures_by_the_buckets_touched_and_dynamic_does_not(monkeypatch):
    # The hooks sit on the models given to generate(); with IPEX forced on (the IPEX lane) the CPU
    # backend runs a prepared copy of the draft that the hooks would not see. Shapes are the policy's,
    # not IPEX's, so count them on the native path.
    monkeypatch.setenv("ASSISTED_BACKENDS_IPEX", "off")
    static, bounds = run_census(static_shapes=True)
    counts = {name: len(static.signatures[name]) for name in ("target", "draft")}
    print(f"\nstatic census {counts} bound {bounds}; draft feed lengths {static.feed_lengths('draft')}")
    assert counts["target"] <= bounds["target"]
    assert counts["draft"] <= bounds["draft"]
    # the target only ever verifies [1, γ+1] after its prefills
    assert set(static.feed_lengths("target")) <= {GAMMA + 1} | {bucketed(p, BUCKET) for p in PROMPT_LENGTHS}

    dynamic, _ = run_census(static_shapes=False)
    dynamic_counts = {name: len(dynamic.signatures[name]) for name in ("target", "draft")}
    print(f"dynamic census {dynamic_counts}")
    assert dynamic_counts["target"] > bounds["target"]
    assert dynamic_counts["draft"] > bounds["draft"]

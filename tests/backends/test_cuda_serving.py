"""Suffix decoding and the serving loop on a real NVIDIA GPU (every test here is skipped without one), fp32, where
output must be the target's own tokens:

- suffix decoding verifies token trees on the GPU (the dynamic layout: one row, a 4-D tree mask) and chains through
  the CUDA graphs (the static layout, where trees are refused); both give `model.generate`'s tokens;
- `generate_live` (the server's engine) on the GPU: rows that join the batch while it runs get their prompt's
  tokens alone.
"""

from __future__ import annotations

import pytest
import torch
from suffix_fixtures import competing_cache, needs_layered_caches
from tiny_models import random_prompt, tiny_model

from assisted_backends import generate

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    ),
]
NEW = 24


def _greedy(model, prompt: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, do_sample=False,
                              pad_token_id=0)  # fmt: skip


@needs_layered_caches
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("layout", ["dynamic", None], ids=["trees", "graphs"])
def test_suffix_decoding_on_the_gpu_is_the_targets_own_greedy(arch, layout, tree_passes):
    target = tiny_model(arch, seed=0).to("cuda", torch.float32)
    for seed in range(2):
        prompt = random_prompt(10, seed=seed).cuda()
        expected = _greedy(target, prompt)
        cache = competing_cache(prompt, expected[0, 10:].tolist())
        result = generate(target, prompt, max_new_tokens=NEW, suffix_cache=cache, num_assistant_tokens=6,
                          cache_layout=layout)  # fmt: skip
        assert torch.equal(result.sequences, expected), (arch, layout, seed)
        assert result.stats.cache_layout == (layout or "static")
    if layout == "dynamic":
        assert tree_passes, "the competing continuations must make trees"
    else:
        assert not tree_passes, "the static layout verifies chains"


def test_live_rows_on_the_gpu_equal_generate_alone():
    from assisted_backends.api.generation import AssistedGenerator
    from assisted_backends.api.queue import generate_live

    target = tiny_model("llama", seed=0).to("cuda", torch.float32)
    draft = tiny_model("llama", seed=3).to("cuda", torch.float32)
    generator = AssistedGenerator(target, draft, dtype="fp32")
    prompts = [random_prompt(length, seed=seed)[0].tolist() for seed, length in enumerate((5, 12, 9, 20, 3))]
    arrive_after = [0, 0, 2, 3, 6]
    state = {"polls": 0, "taken": 0}

    class Arriving:
        def pending(self) -> int:
            state["polls"] += 1
            return sum(1 for at in arrive_after[state["taken"] :] if at <= state["polls"])

        def take(self):
            i = state["taken"]
            state["taken"] += 1
            return i, torch.tensor(prompts[i]), NEW, []

        def cancelled(self) -> list[int]:
            return []

    finished: dict[int, list[int]] = {}
    stats = generate_live(generator, Arriving(), 2, 256, lambda i, t: finished.setdefault(i, t.tolist()),
                          pad_token_id=0)  # fmt: skip
    assert sorted(finished) == list(range(len(prompts))) and stats.joins >= 3
    for i, ids in enumerate(prompts):
        alone = _greedy(target, torch.tensor([ids], device="cuda"))[0, len(ids) :].tolist()
        assert finished[i] == alone, i

"""Suffix caches that make token trees (for the suffix-decoding tests on every device; conftest's `tree_passes` counts
the rounds that verified one)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from assisted_backends.drafters.suffix import SuffixCache

needs_layered_caches = pytest.mark.skipif(
    not hasattr(DynamicCache(), "layers"),
    reason="token trees need transformers >= 4.54 (per-layer caches); before it they are refused and the chain runs",
)


def fill_competing(cache: SuffixCache, prompt: torch.Tensor, output: list[int]) -> SuffixCache:
    """The right continuation once, and two variants of it (each twice) that differ at a few tokens: the index's
    most frequent continuation is wrong there, a sibling is right."""
    for shift in (1, 2):
        wrong = list(output)
        for at in (3, 9, 15):
            wrong[at] = (wrong[at] + shift) % 100 + 3
        cache.add(prompt[0].tolist() + wrong)
        cache.add(prompt[0].tolist() + wrong)
    cache.add(prompt[0].tolist() + output)
    return cache


def competing_cache(prompt: torch.Tensor, output: list[int]) -> SuffixCache:
    """A tree-making cache (`SuffixCache(token_trees=True)`) holding `fill_competing`'s continuations."""
    return fill_competing(SuffixCache(token_trees=True), prompt.cpu(), output)

"""Suffix decoding with token trees (`SuffixCache(token_trees=True)`): the branches the index offers, output identical
to plain decoding across architectures and on the quantized path, the chain wherever trees are refused (batches,
static shapes, windowed caches), and lossless sampling."""

from __future__ import annotations

import pytest
import torch
from architectures import UnknownArchitecture, build, refused_here
from stats_tools import NEW, PROMPT, V, assert_same_distribution, exact_joint, sample_counts
from suffix_fixtures import competing_cache, fill_competing, needs_layered_caches
from tiny_models import random_prompt, reference_greedy, tiny_model
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper

from assisted_backends import generate
from assisted_backends.drafters.suffix import SuffixCache
from assisted_backends.drafters.suffix.automaton import SuffixAutomaton

pytestmark = pytest.mark.usefixtures("one_thread")
TREE_ARCHS = ("llama", "qwen3_moe", "gemma", "phi", "gpt_neox", "opt", "falcon", "gpt2")


def _model(arch: str):
    if refused_here(arch):
        pytest.skip(f"{arch} needs a newer transformers here")
    try:
        return build(arch, seed=0)
    except UnknownArchitecture as error:
        pytest.skip(str(error))


def _row(tokens: list[int]):
    from assisted_backends.drafters.suffix.drafter import _Row

    row = _Row()
    for token in tokens:
        row.index.extend(token)
    return row


def test_branches_follow_the_chain_and_offer_the_siblings_by_count():
    index = SuffixAutomaton()
    for tail in ([7, 8, 9], [7, 8, 9], [7, 5, 6], [4, 3, 2]):
        index.add([1, 2] + tail)
    state, matched = index.match([1, 2])
    assert matched == 2
    found = index.branches(state, [7, 8, 9], width=3, limit=3, min_probability=0.1)
    assert found == [([4, 3, 2], [0.25, 0.25, 0.25]), ([7, 5, 6], [0.25, 0.25])]  # 7 then 5: 3/4 · 1/3
    assert index.branches(state, [7, 8, 9], width=3, limit=3, min_probability=0.3) == []
    assert index.branches(state, [7, 8, 9], width=1, limit=3, min_probability=0.1) == []  # the chain's token only


def test_the_drafter_grows_a_tree_within_its_node_budget_and_prices_it():
    from assisted_backends.drafters.suffix.drafter import SuffixDrafter

    cache = SuffixCache(token_trees=True)
    for tail in ([7, 8, 9, 10], [7, 8, 9, 10], [7, 5, 6, 4], [4, 3, 2, 1]):
        cache.add([1, 2] + tail)
    drafter = SuffixDrafter(16, cache, tree_extra=4)
    tree, extra = drafter.tree(_row([0, 1, 2]), [7, 8, 9, 10], depth=4)
    assert tree.tokens[:4] == (7, 8, 9, 10) and tree.chain_length() == 4
    # a 2-token match ([1, 2]) allows branches of 2 tokens: [4, 3] from the root, [5] below the chain's 7
    assert tree.tokens[4:] == (4, 3, 5) and tree.parents[4:] == (-1, 4, 0)
    assert extra == pytest.approx(0.25 * 3)
    assert SuffixDrafter(16, cache, tree_extra=0).tree(_row([0, 1, 2]), [7, 8, 9, 10], depth=4) is None


@needs_layered_caches
@pytest.mark.parametrize("arch", TREE_ARCHS)
def test_greedy_with_trees_is_plain_decoding(arch, tree_passes):
    target = _model(arch)
    for seed in range(2):
        prompt = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(seed))
        expected = reference_greedy(target, prompt, 24)
        cache = competing_cache(prompt, expected[0, 10:].tolist())
        result = generate(target, prompt, max_new_tokens=24, suffix_cache=cache, num_assistant_tokens=6)
        assert torch.equal(result.sequences, expected), seed
    assert tree_passes, "the competing continuations must make trees"


@needs_layered_caches
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_the_quantized_path_with_trees_is_exact(scheme, tree_passes):
    from assisted_backends.backends.base import BackendOptions
    from assisted_backends.backends.cpu.backend import CPUBackend

    backend = CPUBackend(BackendOptions(dtype=scheme))
    target = backend.prepare(build("llama", seed=0), "target")
    for seed in range(2):
        prompt = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(seed))
        plain = generate(target, prompt, max_new_tokens=24, backend=backend).sequences
        cache = competing_cache(prompt, plain[0, 10:].tolist())
        result = generate(target, prompt, max_new_tokens=24, backend=backend, suffix_cache=cache)
        assert torch.equal(result.sequences, plain)
    assert tree_passes


def test_a_gguf_target_with_trees_is_exact(tmp_path, tree_passes):
    """An int4 (Q4_0) .gguf written here, loaded as the quantized path loads it."""
    from quantized_fixtures import write_tiny_llama_gguf

    from assisted_backends.backends.base import BackendOptions
    from assisted_backends.backends.cpu.backend import CPUBackend
    from assisted_backends.quantized.model import load_gguf_quantized

    pytest.importorskip("gguf", reason="the GGUF tests need the gguf package: pip install gguf")
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0")
    backend = CPUBackend(BackendOptions())
    target = backend.prepare(load_gguf_quantized(path, tokenizer=False).reference, "target")
    prompt = torch.randint(3, 200, (1, 10), generator=torch.Generator().manual_seed(0))
    plain = generate(target, prompt, max_new_tokens=24, backend=backend).sequences
    cache = competing_cache(prompt, plain[0, 10:].tolist())
    result = generate(target, prompt, max_new_tokens=24, backend=backend, suffix_cache=cache)
    assert torch.equal(result.sequences, plain)
    assert tree_passes


@pytest.mark.parametrize("case", ["batch", "static shapes", "sliding window", "trees off"])
def test_where_trees_are_refused_the_chain_serves(case, tree_passes):
    target = build("mistral", seed=0) if case == "sliding window" else tiny_model("llama", seed=0)
    prompts = [random_prompt(8, seed) for seed in range(2 if case == "batch" else 1)]
    expected = [reference_greedy(target, prompt, 20) for prompt in prompts]
    cache = SuffixCache(token_trees=case != "trees off")
    for prompt, output in zip(prompts, expected):
        fill_competing(cache, prompt, output[0, 8:].tolist())
    result = generate(target, torch.cat(prompts), max_new_tokens=20, suffix_cache=cache,
                      static_shapes=case == "static shapes", num_assistant_tokens=4)  # fmt: skip
    for b, output in enumerate(expected):
        assert torch.equal(result.sequences[b], output[0]), b
    assert not tree_passes and result.stats.accepted > 0


@needs_layered_caches
def test_seeded_sampling_with_trees_repeats_itself(tree_passes):
    target = tiny_model("llama", seed=0)
    prompt = random_prompt(8, 0)
    output = reference_greedy(target, prompt, 20)[0, 8:].tolist()

    def sample() -> torch.Tensor:
        cache = competing_cache(prompt, output)
        return generate(target, prompt, max_new_tokens=20, do_sample=True, seed=5, suffix_cache=cache).sequences

    assert torch.equal(sample(), sample())
    assert tree_passes


@needs_layered_caches
@pytest.mark.slow
def test_sampling_with_trees_matches_plain_sampling(tree_passes):
    """The exact-enumeration χ² test (false alarms ≤ 1e-3) with a cache whose every state branches: each round
    verifies a tree, and recursive rejection over siblings keeps the target's distribution."""
    target = tiny_model("llama", seed=0, vocab=V, init=0.15)
    cache = SuffixCache(token_trees=True)
    for first in range(V):
        for second in range(3):
            cache.add([*PROMPT[0].tolist(), first, (first + second) % V, (first + 2) % V, second])
    counts, acceptance = sample_counts(
        lambda seed: generate(target, PROMPT, suffix_cache=cache, max_new_tokens=NEW, do_sample=True, seed=seed),
        2500,
    )
    assert len(tree_passes) > 2500, "most calls must verify trees"
    assert 0.05 < acceptance < 0.9
    assert_same_distribution(
        counts,
        exact_joint(target, LogitsProcessorList([TemperatureLogitsWarper(1.0)])),
        other=exact_joint(target, LogitsProcessorList([TemperatureLogitsWarper(1.5)])),
    )


@needs_layered_caches
def test_the_adaptive_schedule_prices_tree_rounds_by_their_path(tree_passes):
    """The adaptive schedule with γ ≤ 3: a tree of up to γ + 4 nodes is reported to the schedule as its path's
    depth, never as more draft positions than γ."""
    target = tiny_model("llama", seed=0)
    prompt = random_prompt(8, 3)
    expected = reference_greedy(target, prompt, 60)
    cache = competing_cache(prompt, expected[0, 8:].tolist())
    result = generate(
        target, prompt, max_new_tokens=60, suffix_cache=cache, schedule="adaptive", num_assistant_tokens=3
    )
    assert torch.equal(result.sequences, expected)
    assert tree_passes and result.stats.accepted > 30

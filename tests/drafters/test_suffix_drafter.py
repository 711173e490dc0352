"""Suffix decoding through every entry point: output identical to plain decoding (greedy) over the architecture
matrix, batches, static shapes, queues sharing one index, the quantized path; lossless sampling; refusals."""

from __future__ import annotations

import pytest
import torch
from architectures import UnknownArchitecture, build, refused_here
from stats_tools import NEW, PROMPT, V, assert_same_distribution, exact_joint, sample_counts
from tiny_models import random_prompt, reference_greedy, tiny_model
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper

from assisted_backends import AssistedGenerator, generate, generate_queue
from assisted_backends.drafters.suffix import SuffixCache

pytestmark = pytest.mark.usefixtures("one_thread")
MATRIX = ("llama", "mistral", "qwen2", "gemma2", "gemma3_text", "phi", "gpt_neox", "falcon", "bloom", "opt")


def _model(arch: str):
    if refused_here(arch):
        pytest.skip(f"{arch} needs a newer transformers here")
    try:
        return build(arch, seed=0)
    except UnknownArchitecture as error:
        pytest.skip(str(error))


@pytest.mark.parametrize("arch", MATRIX)
def test_greedy_output_is_plain_decodings_and_a_repeated_request_is_drafted_from_the_cache(arch):
    target = _model(arch)
    prompt = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(4))
    expected = reference_greedy(target, prompt, 24)
    cache = SuffixCache()
    first = generate(target, prompt, max_new_tokens=24, suffix_cache=cache)
    assert torch.equal(first.sequences, expected) and first.stats.drafter == "suffix"
    assert cache.requests == 1 and cache.tokens == expected.shape[1]
    again = generate(target, prompt, max_new_tokens=24, suffix_cache=cache, num_assistant_tokens=6)
    assert torch.equal(again.sequences, expected)
    assert again.stats.drafted >= 12 and again.stats.accepted == again.stats.drafted  # the earlier output, whole
    assert again.stats.rounds <= 6


@pytest.mark.parametrize("static_shapes", [False, True])
def test_batches_and_static_shapes_give_each_row_plain_decoding(static_shapes):
    target = tiny_model("llama", seed=0)
    rows = [random_prompt(8, seed) for seed in range(3)]
    cache = SuffixCache()
    generator = AssistedGenerator(target, suffix_cache=cache)
    for prompt in rows[:2]:
        generator.generate(prompt, max_new_tokens=20)
    assert cache.requests == 2
    batch = torch.cat(rows)
    result = generator.generate(batch, max_new_tokens=20, static_shapes=static_shapes, num_assistant_tokens=4)
    for b, prompt in enumerate(rows):
        assert torch.equal(result.sequences[b], reference_greedy(target, prompt, 20)[0]), b
    assert result.stats.accepted > 0 and cache.requests == 5
    if static_shapes:
        assert result.stats.drafted == 4 * result.stats.rounds


def test_a_queue_shares_one_index_across_its_slots_and_calls():
    target = tiny_model("llama", seed=0)
    prompts = [random_prompt(6 + seed % 3, seed)[0] for seed in range(4)] * 2  # each prompt twice
    cache = SuffixCache()
    finished = []
    result = generate_queue(
        target, prompts, slots=2, max_new_tokens=16, suffix_cache=cache, on_finish=lambda i, t: finished.append(i)
    )
    for i, prompt in enumerate(prompts):
        assert torch.equal(result.tokens[i], reference_greedy(target, prompt[None], 16)[0, prompt.shape[0] :]), i
    assert sorted(finished) == list(range(8)) and cache.requests == 8
    assert result.stats.accepted > 0  # the second copies find the first ones' outputs
    generator = AssistedGenerator(target, suffix_cache=True)  # True: the process's cache for this target
    generator.generate_many(prompts[:2], slots=2, max_new_tokens=16)
    assert generator.suffix_cache.requests == 2
    assert AssistedGenerator(target, suffix_cache=True).suffix_cache is generator.suffix_cache


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_the_quantized_path_is_exact(scheme):
    from assisted_backends.backends.base import BackendOptions
    from assisted_backends.backends.cpu.backend import CPUBackend

    backend = CPUBackend(BackendOptions(dtype=scheme))
    target = backend.prepare(build("llama", seed=0), "target")
    prompt = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(2))
    plain = generate(target, prompt, max_new_tokens=20, backend=backend).sequences
    cache = SuffixCache()
    for _ in range(2):
        result = generate(target, prompt, max_new_tokens=20, backend=backend, suffix_cache=cache)
        assert torch.equal(result.sequences, plain)
    assert result.stats.accepted > 0


def test_seeded_sampling_repeats_itself_with_the_same_cache():
    target = tiny_model("llama", seed=0)
    prompt = random_prompt(8, 0)

    def sample() -> torch.Tensor:
        cache = SuffixCache()
        cache.add(reference_greedy(target, prompt, 20)[0].tolist())
        return generate(target, prompt, max_new_tokens=20, do_sample=True, seed=5, suffix_cache=cache).sequences

    assert torch.equal(sample(), sample())


@pytest.mark.slow
def test_sampling_with_the_suffix_drafter_matches_plain_sampling():
    """The exact-enumeration chi-square test of prompt lookup's (false alarms ≤ 1e-3): the cache holds sequences
    over the whole vocabulary, so proposals are made, and q is a point mass."""
    target = tiny_model("llama", seed=0, vocab=V, init=0.15)
    cache = SuffixCache()
    for first in range(V):
        cache.add([*PROMPT[0].tolist(), first, (first + 1) % V, (first + 2) % V, first])
    counts, acceptance = sample_counts(
        lambda seed: generate(target, PROMPT, suffix_cache=cache, max_new_tokens=NEW, do_sample=True, seed=seed),
        2500,
    )
    assert 0.1 < acceptance < 0.9, "proposals must be both accepted and rejected for this test to mean anything"
    assert_same_distribution(
        counts,
        exact_joint(target, LogitsProcessorList([TemperatureLogitsWarper(1.0)])),
        other=exact_joint(target, LogitsProcessorList([TemperatureLogitsWarper(1.5)])),
    )


@pytest.mark.parametrize(
    "other, fix",
    [
        (dict(prompt_lookup_num_tokens=3), "already copies from the prompt"),
        (dict(assistant_early_exit=1), "one drafter per call"),
    ],
)
def test_one_way_of_drafting(other, fix):
    target = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match=f"choose one way of drafting, got .* and suffix_cache.*{fix}"):
        generate(target, torch.tensor([[1, 2]]), suffix_cache=True, max_new_tokens=2, **other)
    with pytest.raises(ValueError, match="suffix_cache got str 'yes'"):
        generate(target, torch.tensor([[1, 2]]), suffix_cache="yes", max_new_tokens=2)


@pytest.mark.parametrize("static_shapes", [False, True])
def test_an_eagle_head_takes_suffix_matches_first(static_shapes):
    """`suffix_cache=` with an EAGLE-3 head: the suffix drafter's match where there is one, the head elsewhere."""
    from eagle_fixtures import random_head

    target = build("llama", seed=0)
    prompt = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(4))
    expected = reference_greedy(target, prompt, 24)
    cache = SuffixCache()
    cache.add(expected[0].tolist())
    result = generate(target, prompt, assistant_model=random_head(target), suffix_cache=cache, max_new_tokens=24,
                      num_assistant_tokens=3, static_shapes=static_shapes)  # fmt: skip
    assert torch.equal(result.sequences, expected)
    assert result.stats.drafter == "eagle3+suffix" and result.stats.accepted >= 12


def test_enable_takes_a_suffix_cache_as_its_default():
    import assisted_backends

    target = tiny_model("llama", seed=0)
    prompt = random_prompt(8, 1)
    expected = reference_greedy(target, prompt, 16)
    cache = SuffixCache()
    assisted_backends.enable(target, suffix_cache=cache)
    try:
        for _ in range(2):
            assert torch.equal(target.generate(prompt, max_new_tokens=16), expected)
        assert target.generate.last_stats.drafter == "suffix" and target.generate.last_stats.accepted > 0
    finally:
        assisted_backends.disable(target)
    assert cache.requests == 2

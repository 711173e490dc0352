"""The prefix cache across calls (`api.prefix`, `engine.prefix_reuse`): on the native decoder step a prefix computed
by an earlier request, in one pass or in several (a prefill, then verify passes, then a longer prompt's prefill),
gives the same bits as computing it again: greedy tokens AND every logit equal cold and warm, for any split point,
alone, in a batch with padding, in a queue, with a drafter. The default is on there and off on transformers' float
modeling; static shapes never reuse; a salt keeps tenants apart."""

from __future__ import annotations

import pytest
import torch
from decoder_models import native_only, prompt, tiny_llama
from tiny_models import tiny_model

from assisted_backends.api.generation import AssistedGenerator, generate, generate_queue
from assisted_backends.engine.prefix_cache import PrefixCache

pytestmark = pytest.mark.usefixtures("one_thread")
NEW = 12
BLOCK = 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(reference, native): transformers' modeling on the quantized kernels with batch-invariant attention, and the
    native decoder step over the same weights."""
    return tiny_llama(str(tmp_path_factory.mktemp("prefix-cache")), tied=True)


@pytest.fixture(scope="module")
def native(models):
    return models[1]


def run(generator: AssistedGenerator, ids: torch.Tensor, **arguments):
    """A greedy call with its logits; a draft model's through `generate` on the generator's target and cache."""
    asked = dict(max_new_tokens=NEW, output_logits=True, return_dict_in_generate=True, **arguments)
    if "assistant_model" in asked:
        return generate(generator.model, ids, prefix_cache=generator.prefix_cache or False, **asked)
    return generator.generate(ids, **asked)


def assert_same_bits(warm, cold) -> None:
    assert torch.equal(warm.sequences, cold.sequences)
    assert len(warm.logits) == len(cold.logits)
    for position, (a, b) in enumerate(zip(warm.logits, cold.logits)):
        assert torch.equal(a, b), position


@native_only
def test_the_default_is_on_for_the_native_step_and_reuse_is_exact_at_any_split(native):
    generator = AssistedGenerator(native, prefix_cache=PrefixCache(block_tokens=BLOCK))
    cold = AssistedGenerator(native, prefix_cache=False)
    assert AssistedGenerator(native).prefix_cache is not None  # the default: on (exact here)
    shared = prompt(45, 7)[0]
    run(generator, shared[None])  # computes and keeps the prefix (and its answer)
    for split in (1, 8, 13, 24, 40, 45):
        asked = torch.cat([shared[:split], prompt(9, split)[0]])[None]
        warm = run(generator, asked)
        assert warm.stats.prefix_reused == min(split, asked.shape[1] - 1) // BLOCK * BLOCK, split
        assert_same_bits(warm, run(cold, asked))


@native_only
def test_a_half_precision_native_cache_keeps_and_restores_its_own_bits(models):
    """`kv_cache_dtype="fp16"`: blocks are kept as the cache stores them (half the bytes), restored bit for bit."""
    from assisted_backends.native.decoder_model import NativeCausalLM

    half = NativeCausalLM(models[0], kv_cache_dtype="fp16")
    generator = AssistedGenerator(half, prefix_cache=PrefixCache(block_tokens=BLOCK))
    shared = prompt(45, 7)[0]
    run(generator, shared[None])
    cache = generator.prefix_cache.cache
    assert cache.blocks and cache.nbytes == cache.blocks * 2 * 2 * 2 * BLOCK * 64 * 2  # layers, k/v, heads, fp16
    asked = torch.cat([shared[:30], prompt(9, 3)[0]])[None]
    warm = run(generator, asked)
    assert warm.stats.prefix_reused == 24
    assert_same_bits(warm, run(AssistedGenerator(half, prefix_cache=False), asked))


@native_only
def test_a_prefix_computed_in_several_passes_restores_the_same_bits(native):
    """Turn 1 computes its prompt in one pass and its answer in verify passes of several tokens, some drafts rejected
    and rolled back (an early-exit draft); turn 2 resends both plus more: it restores blocks of both kinds of pass (its
    answer's included, no rejected draft among them), computes the rest, and equals a cold run; turn 3 restores turn
    2's blocks, themselves computed after a restore."""
    generator = AssistedGenerator(native, prefix_cache=PrefixCache(block_tokens=BLOCK))
    cold = AssistedGenerator(native, prefix_cache=False)
    first = prompt(19, 3)
    turn = run(generator, first, assistant_early_exit=1, num_assistant_tokens=4)
    assert turn.stats.drafted > turn.stats.accepted  # drafts were rejected, their keys rolled back
    for extra in (prompt(11, 4), prompt(6, 5)):
        asked = torch.cat([turn.sequences, extra], dim=1)
        turn = run(generator, asked)
        assert turn.stats.prefix_reused > first.shape[1]  # the answer's blocks too
        assert_same_bits(turn, run(cold, asked))


@native_only
def test_batch_rows_with_padding_reuse_exactly(native):
    generator = AssistedGenerator(native, prefix_cache=PrefixCache(block_tokens=BLOCK))
    cold = AssistedGenerator(native, prefix_cache=False)
    shared = prompt(30, 11)[0]
    run(generator, shared[None])
    rows = [torch.cat([shared[:cut], prompt(5, cut)[0]]) for cut in (30, 17, 26)]
    width = max(row.shape[0] for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - row.shape[0] :], mask[b, width - row.shape[0] :] = row, 1
    warm = run(generator, ids, attention_mask=mask, pad_token_id=0)
    assert warm.stats.prefix_reused > 0
    assert_same_bits(warm, run(cold, ids, attention_mask=mask, pad_token_id=0))
    for b, row in enumerate(rows):  # and each row equals that prompt alone
        alone = run(cold, row[None])
        assert torch.equal(warm.sequences[b, width:], alone.sequences[0, row.shape[0] :]), b


@native_only
def test_a_batch_whose_rows_are_all_padded_and_unmatched_runs_as_cold(native):
    generator = AssistedGenerator(native, prefix_cache=PrefixCache(block_tokens=BLOCK))
    ids = prompt(20, 41, batch=2)
    mask = torch.ones_like(ids)
    mask[0, :3], mask[1, :5] = 0, 0  # every row padded: the columns before the first match are padding only
    warm = run(generator, ids, attention_mask=mask, pad_token_id=0)
    assert warm.stats.prefix_reused == 0
    assert_same_bits(warm, run(AssistedGenerator(native, prefix_cache=False), ids, attention_mask=mask, pad_token_id=0))


@native_only
def test_a_queue_reuses_its_joining_prompts_prefixes_exactly(native):
    cache = PrefixCache(block_tokens=BLOCK)
    shared = prompt(33, 21)[0].tolist()
    prompts = [shared + prompt(4 + i, 30 + i)[0].tolist() for i in range(5)]
    warm = generate_queue(native, prompts, slots=2, max_new_tokens=NEW, pad_token_id=0, prefix_cache=cache)
    cold = generate_queue(native, prompts, slots=2, max_new_tokens=NEW, pad_token_id=0, prefix_cache=False)
    assert warm.stats.prefix_reused >= 3 * 32  # the joining prompts found the first batch's prefix
    assert cold.stats.prefix_reused == 0
    assert [t.tolist() for t in warm.tokens] == [t.tolist() for t in cold.tokens]


@native_only
def test_drafters_see_the_same_tokens_with_a_warm_prefix(native):
    generator = AssistedGenerator(native, prefix_cache=PrefixCache(block_tokens=BLOCK))
    asked = prompt(40, 2)
    asked[0, 20:] = asked[0, :20]  # something for prompt lookup to find
    plain = run(AssistedGenerator(native, prefix_cache=False), asked)
    run(generator, asked)
    for kwargs in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=native, num_assistant_tokens=3),
                   dict(assistant_early_exit=1, num_assistant_tokens=3)):  # fmt: skip
        warm = run(generator, asked, **kwargs)
        assert warm.stats.prefix_reused == 32, kwargs
        assert torch.equal(warm.sequences, plain.sequences), kwargs


@native_only
def test_static_shapes_never_reuse(native):
    generator = AssistedGenerator(native, prefix_cache=PrefixCache(block_tokens=BLOCK))
    asked = prompt(30, 9)
    run(generator, asked)
    static = run(generator, asked, static_shapes=True)
    assert static.stats.prefix_reused == 0
    assert torch.equal(static.sequences, run(generator, asked).sequences)


@native_only
def test_one_tenant_never_reuses_another_tenants_prefix(native):
    cache = PrefixCache(block_tokens=BLOCK)
    generator = AssistedGenerator(native)
    asked = prompt(30, 13)
    assert run(generator, asked, prefix_cache=cache.scope("a")).stats.prefix_reused == 0
    assert run(generator, asked, prefix_cache=cache.scope("b")).stats.prefix_reused == 0
    assert run(generator, asked, prefix_cache=cache.scope("a")).stats.prefix_reused == 24


@native_only
def test_an_opt_in_on_a_quantized_target_with_invariant_attention_is_exact(models):
    """transformers' modeling on the quantized kernels with batch-invariant attention computes each row alone too:
    reuse is exact there, offered as an opt-in (the default stays off outside the native step)."""
    reference = models[0]
    assert AssistedGenerator(reference).prefix_cache is None
    generator = AssistedGenerator(reference, prefix_cache=PrefixCache(block_tokens=BLOCK))
    cold = AssistedGenerator(reference, prefix_cache=False)
    shared = prompt(40, 17)[0]
    run(generator, shared[None])
    for split in (13, 40):
        asked = torch.cat([shared[:split], prompt(6, split)[0]])[None]
        warm = run(generator, asked)
        assert warm.stats.prefix_reused == split // BLOCK * BLOCK
        assert_same_bits(warm, run(cold, asked))


def test_the_default_is_off_on_transformers_float_modeling():
    model = tiny_model("llama", seed=0)
    generator = AssistedGenerator(model)
    assert generator.prefix_cache is None
    asked = torch.randint(0, 100, (1, 30), generator=torch.Generator().manual_seed(0))
    generator.generate(asked, max_new_tokens=4)
    assert generator.generate(asked, max_new_tokens=4).stats.prefix_reused == 0


def test_an_explicit_opt_in_on_float_modeling_reuses_and_keeps_the_greedy_tokens():
    """fp32 transformers' modeling: restored keys may differ from recomputed ones in the last bits (its GEMMs round by
    the positions fed), so only the tokens are compared, on a model with no near-ties in these steps."""
    model = tiny_model("llama", seed=0)
    asked = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(1))
    cold = AssistedGenerator(model, prefix_cache=False).generate(asked, max_new_tokens=8)
    generator = AssistedGenerator(model, prefix_cache=PrefixCache(block_tokens=BLOCK))
    generator.generate(asked, max_new_tokens=8)
    warm = generator.generate(asked, max_new_tokens=8)
    assert warm.stats.prefix_reused == 32
    assert torch.equal(warm.sequences, cold.sequences)


def test_a_cache_serves_one_model_and_bad_values_are_one_error():
    cache, model = PrefixCache(), tiny_model("llama", seed=0)
    AssistedGenerator(model, prefix_cache=cache)
    with pytest.raises(ValueError, match="another model"):
        AssistedGenerator(tiny_model("llama", seed=1), prefix_cache=cache)
    with pytest.raises(ValueError, match="prefix_cache="):
        AssistedGenerator(tiny_model("llama", seed=0), prefix_cache="yes")

"""The native step's attention past one chunk of keys (`csrc/cache_attention.cpp`, `csrc/chunk_attention.h`): each
row's keys in fixed chunks of 256, combined in chunk order, so a long context splits over threads and still gives
the same bits at any thread count and for a row alone or inside a batch; a half cache (`kv_cache_dtype="fp16"` /
"bf16") attends as the fp32 attention of its rounded values, and decoding on it stays exact (assisted == plain)."""

from __future__ import annotations

import pytest
import torch
from decoder_models import VOCAB, prompt, tiny_llama

from assisted_backends.native import decoder_build, extension
from assisted_backends.quantized.kernels import same_bits

pytestmark = pytest.mark.skipif(
    not extension.available() or bool(decoder_build.why_unavailable()),
    reason="the native decoder needs the package's kernels and a compiler",
)
CHUNK = 256  # chunk_attention.h's kChunk
LONG = 300  # a prompt past one chunk (the tiny model's rotary table ends at 512)


def _threads(count: int, body):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return body()
    finally:
        torch.set_num_threads(before)


def _cache_inputs(seed: int, batch: int = 2, heads: int = 6, kv_heads: int = 2, rows: int = 3, keys: int = 700,
                  dim: int = 64):  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, rows, dim, generator=generator)
    k, v = (torch.randn(batch, kv_heads, keys, dim, generator=generator) for _ in range(2))
    return q, k, v


def _attend(q, k, v, allowed=None, start=None, window=0, isa=-1):
    start = k.shape[2] - q.shape[2] if start is None else start
    return torch.ops.assisted_backends.cache_attention.default(q, k, v, allowed, start, window, q.shape[3] ** -0.5, isa)


def _sdpa(q, k, v, allowed, start):
    """Attention in float64 by ATen, each row over keys t ≤ start + m with allowed[b, t]."""
    rows, keys, groups = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    causal = torch.arange(keys)[None, :] <= (start + torch.arange(rows))[:, None]
    mask = causal[None, None] & allowed[:, None, None, :]
    expanded = (x.double().repeat_interleave(groups, dim=1) for x in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.double(), *expanded, attn_mask=mask).transpose(1, 2)


def test_attention_over_many_chunks_is_attention():
    q, k, v = _cache_inputs(0)
    allowed = torch.ones(2, k.shape[2], dtype=torch.bool)
    allowed[1, :37] = False  # row 1 left-padded
    out = _attend(q, k, v, allowed)
    assert out.shape == (2, 3, 6, 64)
    assert torch.allclose(out.double(), _sdpa(q, k, v, allowed, k.shape[2] - 3), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 5, 20])  # steps and verify passes split by chunks; 20 rows go by row
def test_the_same_bits_at_one_and_two_threads(rows):
    q, k, v = _cache_inputs(1, batch=1, heads=9, kv_heads=3, rows=rows, keys=1100)
    one = _threads(1, lambda: _attend(q, k, v))
    for _ in range(5):  # chunks handed out dynamically: each run may split them differently
        assert same_bits(_threads(2, lambda: _attend(q, k, v)), one)


def test_a_row_alone_equals_the_row_inside_a_padded_batch():
    q, k, v = _cache_inputs(2, batch=3, rows=4, keys=600)
    pad = [0, 45, 300]
    allowed = torch.ones(3, 600, dtype=torch.bool)
    for b, count in enumerate(pad):
        allowed[b, :count] = False
    batch = _attend(q, k, v, allowed)
    for b, count in enumerate(pad):  # alone: the same keys without the padding in front, one row at a time
        for m in range(4):
            alone = _attend(q[b : b + 1, :, m : m + 1], k[b : b + 1, :, count:], v[b : b + 1, :, count:],
                            start=600 - count - 4 + m)  # fmt: skip
            assert same_bits(alone[0, 0], batch[b, m]), (b, m)
    tall = q.repeat(1, 1, 6, 1)
    many = _attend(tall, k, v, allowed, start=600 - 24)  # 72 rows: by row, not by chunk
    for b, m in ((0, 0), (1, 13), (2, 23)):
        single = _attend(tall[b : b + 1, :, m : m + 1], k[b : b + 1], v[b : b + 1], allowed[b : b + 1], 576 + m)
        assert same_bits(single[0, 0], many[b, m]), (b, m)


def test_every_path_and_the_row_attention_kernel_give_the_same_bits():
    q, k, v = _cache_inputs(3, keys=520)
    allowed = torch.rand(2, 520, generator=torch.Generator().manual_seed(4)) > 0.1
    vector = _attend(q, k, v, allowed)
    assert same_bits(_attend(q, k, v, allowed, isa=0), vector)  # the scalar path: the same operations
    lengths = torch.arange(518, 521)
    mask = allowed[:, None, None, :].expand(2, 1, 3, 520)
    kernel = torch.ops.assisted_backends.row_attention.default(q, k, v, mask, lengths, 64**-0.5, -1)
    assert same_bits(kernel, vector)


def test_a_sliding_window_attends_only_its_keys():
    q, k, v = _cache_inputs(5, rows=2, keys=800)
    out = _attend(q, k, v, window=300)
    assert same_bits(out[:, 1:], _attend(q[:, :, 1:], k[:, :, 500:], v[:, :, 500:]))  # keys 500..799


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_cache_attends_as_the_fp32_attention_of_its_values(dtype):
    q, k, v = _cache_inputs(6, keys=640)
    half_k, half_v = k.to(dtype), v.to(dtype)
    for isa in (-1, 0):
        assert same_bits(_attend(q, half_k, half_v, isa=isa), _attend(q, half_k.float(), half_v.float(), isa=isa))


def test_a_cache_of_another_type_is_refused_by_name():
    q, k, v = _cache_inputs(7, keys=32)
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        _attend(q, k.double(), v.double())


# ---- the native step at a long context --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_llama(str(tmp_path_factory.mktemp("long-context")))


@pytest.fixture(scope="module")
def half_models(models):
    from assisted_backends.native.decoder_model import NativeCausalLM

    reference, _ = models
    return {name: NativeCausalLM(reference, kv_cache_dtype=name) for name in ("fp16", "bf16")}


def _step_logits(native, tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The logits of `rows` [1, M] after a prefill of `tokens`, in a fresh cache."""
    cache = native.new_native_cache()
    with torch.inference_mode():
        native(tokens, past_key_values=cache, logits_to_keep=1)
        return native(rows, past_key_values=cache).logits


def test_a_long_context_step_is_the_same_at_one_and_two_threads(models):
    _, native = models
    tokens, rows = prompt(LONG, 11), prompt(4, 12)
    one = _threads(1, lambda: (_step_logits(native, tokens, rows[:, :1]), _step_logits(native, tokens, rows)))
    for _ in range(2):
        two = _threads(2, lambda: (_step_logits(native, tokens, rows[:, :1]), _step_logits(native, tokens, rows)))
        assert same_bits(two[0], one[0]) and same_bits(two[1], one[1])
    assert same_bits(one[1][:, :1], one[0])  # a verify pass's first row is the step


def test_a_long_context_row_alone_equals_the_row_inside_a_padded_batch(models):
    _, native = models
    lengths, width = (LONG, LONG - 40), LONG
    prompts = [prompt(n, 20 + n) for n in lengths]
    tokens = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    for b, (n, ids) in enumerate(zip(lengths, prompts, strict=True)):
        tokens[b, width - n :], mask[b, width - n :] = ids[0], 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    step = prompt(1, 30).expand(2, 1)
    cache = native.new_native_cache()
    with torch.inference_mode():
        first = native(tokens, attention_mask=mask, position_ids=positions, past_key_values=cache, logits_to_keep=1)
        first = first.logits
        grown = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        batch = native(step, attention_mask=grown, position_ids=positions[:, -1:] + 1, past_key_values=cache).logits
    for b, ids in enumerate(prompts):
        alone = native.new_native_cache()
        with torch.inference_mode():
            assert same_bits(native(ids, past_key_values=alone, logits_to_keep=1).logits[0], first[b]), b
            assert same_bits(native(step[:1], past_key_values=alone).logits[0], batch[b]), b


def _spread(reference, tokens: torch.Tensor, relative: float) -> float:
    """The largest change in the reference's logits over four draws of a Gaussian relative change of its embedded
    input (one draw may move no activation across an int8 quantization step)."""
    with torch.inference_mode():
        embedded = reference.get_input_embeddings()(tokens)
        ours = reference(inputs_embeds=embedded).logits
        changes = []
        for seed in range(4):
            nudge = 1 + relative * torch.randn(embedded.shape, generator=torch.Generator().manual_seed(seed))
            changes.append(float((ours - reference(inputs_embeds=embedded * nudge).logits).abs().max()))
    return max(changes)


def test_a_long_context_is_close_to_the_reference(models):
    """The tolerance of test_decoder.py: 3x the largest change a 1e-7 relative change of the embedded input makes in
    the reference's own logits (docs/native.md), here over a prompt of more than one chunk."""
    reference, native = models
    tokens = prompt(LONG, 13)
    spread = _spread(reference, tokens, 1e-7)
    with torch.inference_mode():
        difference = float((native(tokens).logits - reference(tokens).logits).abs().max())
    assert 0 < spread and difference <= 3 * spread, (difference, spread)


# ---- a half cache -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_a_half_cache_holds_the_fp32_cache_rounded(models, half_models, name):
    _, native = models
    half = half_models[name]
    tokens = prompt(LONG, 14)
    full, rounded = native.new_native_cache(), half.new_native_cache()
    with torch.inference_mode():
        native(tokens, past_key_values=full, logits_to_keep=1)
        half(tokens, past_key_values=rounded, logits_to_keep=1)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    assert rounded.keys[0].dtype == dtype
    # layer 0's keys and values come before any attention: the fp32 ones, rounded to nearest even
    assert same_bits(rounded.layers[0].keys, full.layers[0].keys.to(dtype))
    assert same_bits(rounded.layers[0].values, full.layers[0].values.to(dtype))


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_a_half_cache_differs_from_fp32_by_its_rounding(models, half_models, name):
    """Stated tolerance: over a long prompt and the step after it, the logits of a half cache lie within 2x the
    largest change that a relative change of the cache's rounding size (2^-11 for fp16, 2^-8 for bf16, Gaussian,
    four draws) of the embedded input makes in the reference's logits. (The activations' int8 quantization turns
    any such change into whole quantization steps. Measured on one draw, fp16: 0.56-0.72 against 0.94-1.20; bf16:
    0.73-0.80 against 1.9-2.8, in logits of standard deviation 3.2.)"""
    reference, native = models
    tokens, rows = prompt(LONG, 15), prompt(3, 16)
    spread = _spread(reference, tokens, {"fp16": 2.0**-11, "bf16": 2.0**-8}[name])
    with torch.inference_mode():
        expected = torch.cat([native(tokens).logits, _step_logits(native, tokens, rows)], dim=1)
        half = half_models[name]
        got = torch.cat([half(tokens).logits, _step_logits(half, tokens, rows)], dim=1)
    difference = float((got - expected).abs().max())
    assert 0 < difference <= 2 * spread, (difference, spread)


@pytest.mark.usefixtures("one_thread", "one_token_matches")
def test_assisted_decoding_on_a_half_cache_equals_plain_decoding(half_models):
    from assisted_backends import generate
    from assisted_backends.backends.base import BackendOptions
    from assisted_backends.backends.cpu.backend import CPUBackend

    native = half_models["fp16"]
    backend = CPUBackend(BackendOptions())
    start = prompt(CHUNK + 20, 17)
    start[0, -8:] = start[0, 100:108]  # something for prompt lookup to find
    plain = generate(native, start, max_new_tokens=24, backend=backend)
    assert plain.sequences.shape[1] >= CHUNK + 28 and int(plain.sequences.max()) < VOCAB  # new tokens (EOS may stop)
    for kwargs in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=native, num_assistant_tokens=3)):
        result = generate(native, start, max_new_tokens=24, backend=backend, **kwargs)
        assert torch.equal(result.sequences, plain.sequences), kwargs
        assert result.stats.drafted > 0, kwargs


def test_an_unknown_cache_type_is_one_value_error(models):
    from assisted_backends.native.decoder_model import NativeCausalLM, native_model

    reference, _ = models
    for make in (NativeCausalLM, native_model):
        with pytest.raises(ValueError, match="kv_cache_dtype='fp8' is not one of 'fp32', 'fp16', 'bf16'"):
            make(reference, kv_cache_dtype="fp8")


def test_the_loader_keeps_the_half_cache_it_is_asked_for(tmp_path):
    from decoder_models import write_tiny_llama

    from assisted_backends.quantized.model import load_gguf_quantized

    path = write_tiny_llama(tmp_path / "tiny-half.gguf")
    half = load_gguf_quantized(path, tokenizer=False, use_cache=False, kv_cache_dtype="fp16").model
    assert half.kv_cache_dtype == torch.float16 and half.new_native_cache().dtype == torch.float16
    assert load_gguf_quantized(path, tokenizer=False, use_cache=False).model.kv_cache_dtype == torch.float32
    with pytest.raises(ValueError, match="kv_cache_dtype='f16' is not one of"):
        load_gguf_quantized(path, tokenizer=False, use_cache=False, kv_cache_dtype="f16")

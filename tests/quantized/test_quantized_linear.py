"""QuantizedLinear / QuantizedEmbedding / quantize_model: values, batch invariance, tied storage."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from assisted_backends.quantized import kernels
from assisted_backends.quantized.linear import QuantizedEmbedding, QuantizedLinear, quantize_model
from assisted_backends.quantized.packing import int4_from_values

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not kernels.available().int4 or not kernels.available().int8pack_mm, reason="weight-only kernels"
    ),
]
LAYERS = (("int8", 0), ("int4", 32), ("int4", 64), ("int4", 128))


def _layer(
    scheme: str, group: int, n: int = 384, k: int = 640, dtype=torch.bfloat16
) -> tuple[QuantizedLinear, torch.Tensor]:
    generator = torch.Generator().manual_seed(n + k + group)
    weight = torch.randn(n, k, generator=generator) * 0.05
    bias = torch.randn(n, generator=generator)
    return QuantizedLinear.from_float(weight, bias, scheme, group or 32, dtype), weight


@pytest.mark.parametrize("scheme,group", LAYERS)
def test_quantized_linear_is_batch_invariant(scheme, group):
    layer, _ = _layer(scheme, group)
    x = torch.randn(16, 640, generator=torch.Generator().manual_seed(9))
    result = kernels.batch_invariance(layer, x)
    assert all(result.values()), f"M with differing rows: {[m for m, ok in result.items() if not ok]}"


@pytest.mark.parametrize("bits", (5, 8, 13))
def test_multi_plane_layer_is_batch_invariant(bits):
    generator = torch.Generator().manual_seed(bits)
    values = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (256, 512), generator=generator)
    scales = torch.rand(256, 2, generator=generator) * 1e-3
    layer = QuantizedLinear(int4_from_values(values, scales, None, 256, bits))
    x = torch.randn(16, 512, generator=generator)
    assert all(kernels.batch_invariance(layer, x).values())


@pytest.mark.parametrize("scheme,group", LAYERS)
def test_fp32_compute_is_x_times_the_dequantized_weight(scheme, group):
    layer, weight = _layer(scheme, group, dtype=torch.float32)
    x = torch.randn(3, 640, generator=torch.Generator().manual_seed(1))
    expected = x.double() @ layer.dequantized_weight().double().t() + layer.bias.double()
    assert torch.allclose(layer(x).double(), expected, rtol=1e-5, atol=1e-5)
    # and the quantization itself is within half a step of the float weight it came from
    if scheme == "int8":
        step = layer.scales.float()[:, None].expand(-1, 640)
    else:
        step = layer.scale_zeros[..., 0].t().float().repeat_interleave(group, dim=1)
    error = (layer.dequantized_weight() - weight).abs()
    assert (error <= step / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("scheme,group", LAYERS)
def test_bf16_compute_is_close_to_its_own_weights(scheme, group):
    # bf16 activations, fp32 accumulation, bf16 output: a few bf16 ulps of x·|W|.
    layer, _ = _layer(scheme, group)
    x = torch.randn(5, 640, generator=torch.Generator().manual_seed(2))
    fast = layer(x)
    assert fast.dtype == torch.float32 and fast.shape == (5, 384)
    weight = layer.dequantized_weight().double()
    expected = x.double() @ weight.t() + layer.bias.double()
    scale = x.double().abs() @ weight.abs().t() + layer.bias.double().abs()
    assert ((fast.double() - expected).abs() <= 2.0**-6 * scale).all()


def test_layer_accepts_any_leading_shape_and_no_rows():
    layer, _ = _layer("int4", 32)
    x = torch.randn(2, 3, 640)
    assert torch.equal(layer(x), layer(x.reshape(6, 640)).reshape(2, 3, 384))
    assert layer(torch.zeros(0, 640)).shape == (0, 384)


def test_layer_survives_a_misaligned_input():
    layer, _ = _layer("int8", 0)
    base = torch.randn(2 * 640 + 8).to(torch.bfloat16)
    x = base[8:].view(2, 640)  # 16 bytes past an aligned start
    assert torch.equal(layer(x.float()), layer(x.contiguous().clone().float()))
    assert torch.equal(layer(x), layer(x.clone()))


def _tiny_llama(tied: bool, hidden: int = 64, vocab: int = 96):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("scheme", ("int8", "int4"))
def test_quantize_model_replaces_every_linear_and_shares_a_tied_table(scheme):
    model = quantize_model(_tiny_llama(tied=True), scheme)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert not linears, f"left as nn.Linear: {linears}"
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(embedding, QuantizedEmbedding) and isinstance(head, QuantizedLinear)
    for name in head.buffer_names():  # one storage for both (the package's blocks, or PyTorch's layout)
        assert getattr(embedding, name).data_ptr() == getattr(head, name).data_ptr()
    ids = torch.tensor([[3, 17, 95, 0]])
    assert torch.equal(embedding(ids)[0], head.dequantized_weight()[ids[0]])
    assert "shared" in model.quantization_report["model.embed_tokens"]
    logits = model(ids).logits
    assert logits.shape == (1, 4, 96) and torch.isfinite(logits).all()


def test_quantize_model_keeps_layers_the_kernel_cannot_take():
    model = _tiny_llama(tied=False)
    model.model.layers[0].mlp.down_proj = nn.Linear(40, 64, bias=False)  # K = 40: not a multiple of 16
    model.model.layers[0].mlp.up_proj = nn.Linear(64, 40, bias=False)
    model.model.layers[0].mlp.gate_proj = nn.Linear(64, 40, bias=False)
    quantize_model(model, "int8")
    assert type(model.model.layers[0].mlp.down_proj) is nn.Linear
    assert "kept" in model.quantization_report["model.layers.0.mlp.down_proj"]
    assert isinstance(model.model.layers[0].mlp.up_proj, QuantizedLinear)  # K = 64 is fine for int8
    quantize_model(model, "int4")  # N = 40: not a multiple of 16 for int4
    assert type(model.model.layers[0].mlp.up_proj) is QuantizedLinear  # already int8, left alone


def test_quantize_model_handles_gpt2_conv1d():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=80, n_positions=32)).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    reference = model(ids).logits
    quantize_model(model, "int8", dtype=torch.float32)
    assert isinstance(model.transformer.h[0].attn.c_attn, QuantizedLinear)
    assert model.transformer.h[0].attn.c_attn.out_features == 192  # Conv1D [in, out] read transposed
    assert (model(ids).logits - reference).abs().max() < 0.05 * reference.abs().max()


def test_embedding_keeps_gemma_scale():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=64,
        sliding_window=16,
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    ids = torch.tensor([[5, 9, 2]])
    reference = model.get_input_embeddings()(ids)
    quantize_model(model, "int8", dtype=torch.float32)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, QuantizedEmbedding) and embedding.embed_scale is not None
    assert (embedding(ids) - reference).abs().max() < 0.01 * reference.abs().max()

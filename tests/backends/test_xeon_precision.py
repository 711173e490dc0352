"""Greedy identity with every draft precision (the target verifies, so the output cannot change),
w8af32 quantization itself, and `prepare` being idempotent and leaving the user's draft alone."""

from functools import cache

import pytest
import torch
from tiny_models import ARCHITECTURES, noisy_copy, random_prompt, reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu import quantize
from assisted_backends.backends.cpu.backend import CPUBackend
from assisted_backends.quantized.linear import QuantizedLinear

MAX_NEW_TOKENS = 19
DRAFT_PRECISIONS = ("fp32", "bf16", "w8af32")


@pytest.fixture(autouse=True)
def _cpu_with_bf16(tmp_path, monkeypatch):
    """bf16 is refused on CPUs without bf16 instructions; fake a Zen 4 so these tests run anywhere."""
    path = tmp_path / "cpuinfo"
    path.write_text("model name\t: Fake Zen 4\nflags\t\t: avx512f avx512_bf16 avx512_vnni\n")
    monkeypatch.setenv("ASSISTED_BACKENDS_CPUINFO", str(path))
    monkeypatch.setenv("ASSISTED_BACKENDS_IPEX", "off")  # test_xeon_ipex.py covers IPEX


@cache
def pair(arch: str):
    """A fresh target (never cast by another test) and a partially accepting draft."""
    target = tiny_model(arch, seed=0)
    return target, noisy_copy(target, seed=3, scale=0.02)


@cache
def expected(arch: str, prompt_length: int) -> torch.Tensor:
    target, _ = pair(arch)
    return reference_greedy(target, random_prompt(prompt_length, seed=prompt_length), MAX_NEW_TOKENS)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("layout", ["dynamic", "static"])
@pytest.mark.parametrize("draft_precision", DRAFT_PRECISIONS)
def test_every_draft_precision_keeps_greedy_output(arch, layout, draft_precision):
    target, draft = pair(arch)
    for prompt_length in (1, 9):
        result = generate(
            target,
            random_prompt(prompt_length, seed=prompt_length),
            assistant_model=draft,
            max_new_tokens=MAX_NEW_TOKENS,
            num_assistant_tokens=3,
            cache_layout=layout,
            device="cpu",
            dtype="fp32",
            draft_precision=draft_precision,
        )
        assert torch.equal(result.sequences, expected(arch, prompt_length)), (arch, layout, draft_precision)
    assert next(target.parameters()).dtype == torch.float32  # the target was not cast along with the draft


@pytest.mark.parametrize("method", quantize.METHODS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_both_w8af32_paths_keep_greedy_output(monkeypatch, arch, method):
    monkeypatch.setattr(quantize, "DEFAULT_METHOD", method)
    target, draft = pair(arch)
    result = generate(
        target,
        random_prompt(9, seed=9),
        assistant_model=draft,
        max_new_tokens=MAX_NEW_TOKENS,
        num_assistant_tokens=3,  # a fixed γ: the adaptive schedule may choose not to draft at all
        draft_precision="w8af32",
    )
    assert torch.equal(result.sequences, expected(arch, 9))
    assert result.stats.drafted > 0


@pytest.mark.parametrize("draft_precision", DRAFT_PRECISIONS)
def test_bf16_target_assisted_equals_bf16_target_alone(draft_precision):
    """With the target in bf16, assisted greedy equals the same bf16 target decoding alone."""
    target, draft = tiny_model("llama", seed=0), noisy_copy(tiny_model("llama", seed=0), seed=3, scale=0.02)
    backend = CPUBackend(BackendOptions(dtype="bf16", draft_precision=draft_precision))
    prompt = random_prompt(7, seed=7)
    alone = generate(target, prompt, max_new_tokens=MAX_NEW_TOKENS, backend=backend)
    assisted = generate(
        target, prompt, assistant_model=draft, max_new_tokens=MAX_NEW_TOKENS, num_assistant_tokens=3, backend=backend
    )
    assert assisted.stats.drafted > 0
    assert next(target.parameters()).dtype == torch.bfloat16
    assert torch.equal(assisted.sequences, alone.sequences)
    with torch.inference_mode():
        hf = target.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    assert torch.equal(alone.sequences, hf)


@pytest.mark.parametrize("method", quantize.METHODS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_w8af32_stores_int8_weights_and_leaves_the_original(arch, method):
    model = tiny_model(arch, seed=0)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    quantized = quantize.quantize_w8af32(model, method)
    assert quantize.is_quantized(quantized) and not quantize.is_quantized(model)
    float_linears = [
        name for name, m in quantized.named_modules() if type(m) is torch.nn.Linear and m.in_features % 16 == 0
    ]
    assert not float_linears, f"linears left in fp32: {float_linears}"
    assert not any(type(m).__name__ == "Conv1D" for m in quantized.modules())
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    prompt = random_prompt(12, seed=1)
    with torch.inference_mode():
        reference, approximate = model(prompt).logits, quantized(prompt).logits
    assert approximate.dtype == torch.float32  # fp32 at the module boundary
    assert (approximate - reference).norm() / reference.norm() < 0.25


def test_int8pack_linear_matches_a_dequantized_reference():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    packed = QuantizedLinear.from_float(linear.weight, linear.bias, "int8", activations="float")
    assert packed.codes.dtype == torch.int8 and packed.codes.shape == (48, 64)
    x = torch.randn(3, 5, 64)
    dequantized = packed.codes.float() * packed.scales.float()[:, None]
    reference = x @ dequantized.t() + linear.bias
    assert torch.allclose(packed(x), reference, rtol=2e-2, atol=2e-2)
    assert packed(x).dtype == torch.float32


def test_int8pack_skips_widths_the_kernel_mishandles():
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.Linear(32, 8))
    quantized = quantize.quantize_w8af32(model, "int8pack")
    assert type(quantized[0]) is torch.nn.Linear  # in_features 24 is not a multiple of 16
    assert isinstance(quantized[1], QuantizedLinear) and quantized[1].scheme == "int8"


def test_prepare_is_idempotent_and_copies_only_the_draft():
    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1, hidden=32, layers=1)
    draft_before = {name: tensor.clone() for name, tensor in draft.state_dict().items()}
    backend = CPUBackend(BackendOptions(dtype="bf16", draft_precision="w8af32"))
    prepared_target = backend.prepare(target, "target")
    prepared_draft = backend.prepare(draft, "draft")
    assert prepared_target is target and next(target.parameters()).dtype == torch.bfloat16
    assert prepared_draft is not draft and quantize.is_quantized(prepared_draft)
    assert all(torch.equal(draft_before[name], tensor) for name, tensor in draft.state_dict().items())
    # Again, from the originals and from the prepared models, on this backend and on a new one.
    again = CPUBackend(BackendOptions(dtype="bf16", draft_precision="w8af32"))
    for b in (backend, again):
        assert b.prepare(target, "target") is prepared_target
        assert b.prepare(draft, "draft") is prepared_draft
        assert b.prepare(prepared_draft, "draft") is prepared_draft


def test_self_draft_in_another_precision_leaves_the_target_alone():
    target = tiny_model("llama", seed=0)
    prompt = random_prompt(5, seed=5)
    reference = reference_greedy(target, prompt, 12)
    result = generate(
        target,
        prompt,
        assistant_model=target,
        max_new_tokens=12,
        num_assistant_tokens=4,
        dtype="fp32",
        draft_precision="bf16",
    )
    assert next(target.parameters()).dtype == torch.float32
    assert torch.equal(result.sequences, reference)
    assert result.stats.acceptance_rate > 0.5


def test_casting_back_up_after_an_in_place_downcast_is_refused():
    target = tiny_model("llama", seed=0)
    generate(target, random_prompt(3, 0), max_new_tokens=2, dtype="bf16")
    with pytest.raises(ValueError, match="cast in place from torch.float32 to torch.bfloat16.*Load it again"):
        generate(target, random_prompt(3, 0), max_new_tokens=2, dtype="fp32")


@pytest.mark.parametrize("method", quantize.METHODS)
def test_parameter_ratio_counts_a_quantized_draft_as_unquantized(method):
    """w8af32 packs linear weights into buffers that `parameters()` does not list; the never-try rule
    (draft ≥ 90% of the target) must still see a quantized self-draft as the target's size."""
    from assisted_backends.drafters.factory import drafting_request, plan_drafting
    from assisted_backends.model_facts import ModelFacts

    target, _ = pair("llama")
    draft = quantize.quantize_w8af32(target, method)
    assert sum(p.numel() for p in draft.parameters()) < 0.9 * sum(p.numel() for p in target.parameters())
    spec = plan_drafting(ModelFacts.of(target), drafting_request(draft), draft, ModelFacts.of(draft), None, None)
    assert spec.cost_ratio == pytest.approx(1.0)
    assert ModelFacts.of(draft).parameters == ModelFacts.of(target).parameters


def test_default_w8af32_path_avoids_the_deprecated_torch_ao_quantization():
    """The default path is a maintained core op (`aten._weight_int8pack_mm`): no torch.ao modules, no warning."""
    import warnings

    target, _ = pair("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draft = quantize.quantize_w8af32(target)
    kinds = {type(module).__module__ for module in draft.modules()}
    assert not any(kind.startswith("torch.ao") for kind in kinds), kinds
    assert any(isinstance(module, QuantizedLinear) for module in draft.modules())

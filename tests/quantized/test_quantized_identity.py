"""Quantized targets (weight-only int8 / int4 on PyTorch's CPU kernels) are exact in the package's sense: greedy
assisted output equals the same quantized model's plain decoding through the package, for every drafter, both
cache layouts, static shapes and batches, on every architecture of the matrix (docs/design.md rule 1).

Why it can hold bit for bit: the weight kernels compute each row alone, and the CPU backend gives quantized
targets batch-invariant attention (`backends.cpu.invariant_attention`), so a verify pass over γ + 1 positions
computes the very logits the one-token steps would. That is asserted directly (logits, bit for bit) wherever
the backend reports batch-invariant attention.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
import transformers
from architectures import ARCH_NAMES, UnknownArchitecture, build, refused_here

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu.backend import CPUBackend
from assisted_backends.engine.kv_cache import make_layout
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.quantized.linear import QuantizedLinear

pytestmark = pytest.mark.usefixtures("one_thread", "one_token_matches")
NEW = 20
EARLY_EXIT_ARCHS = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma3_text", "phi3", "granite"}


@cache
def quantized(arch: str, scheme: str):
    """(a backend that quantizes targets to `scheme`, the prepared target, its attention report)."""
    if refused_here(arch):
        pytest.skip(f"{arch} needs a newer transformers here")
    try:
        model = build(arch, seed=0)
    except UnknownArchitecture as error:
        pytest.skip(str(error))
    backend = CPUBackend(BackendOptions(dtype=scheme))
    target = backend.prepare(model, "target")
    assert any(isinstance(m, QuantizedLinear) for m in target.modules()), "the target must be quantized"
    report = backend.describe()
    return backend, target, report.get("dtype"), report.get("target_attention"), report.get("target_verify_pass")


def _logits(target, prompt: torch.Tensor, tokens: torch.Tensor, one_by_one: bool, layout: str) -> torch.Tensor:
    runner = ModelRunner(target, make_layout(layout, target, torch.zeros(prompt.shape[0], dtype=torch.long), 64, 16))
    runner.forward(prompt)
    if one_by_one:
        return torch.cat([runner.forward(tokens[:, i : i + 1]) for i in range(tokens.shape[1])], dim=1)
    return runner.forward(tokens)


@pytest.mark.parametrize("scheme", ["int4", "int8"])
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_a_verify_pass_computes_the_one_token_steps_logits_bit_for_bit(arch, scheme):
    backend, target, _, _, verify = quantized(arch, scheme)
    if verify != "bit-identical to one-token steps":
        pytest.skip(f"{arch}: {verify}")
    prompt, tokens = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1)).split([1, 1])
    tokens = tokens[:, :5]
    for layout in ("dynamic", "static"):
        steps = _logits(target, prompt, tokens, True, layout)
        verify = _logits(target, prompt, tokens, False, layout)
        assert torch.equal(steps, verify), (arch, layout, float((steps - verify).abs().max()))


@pytest.mark.parametrize("scheme", ["int4", "int8"])
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_assisted_greedy_equals_the_quantized_models_plain_decoding(arch, scheme):
    backend, target, _, _, verify = quantized(arch, scheme)
    if "experts" in verify:  # tokens equal up to near-ties only: the fused expert matmul mixes rows
        pytest.skip(f"{arch}: {verify}")
    prompt = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(2))
    plain = generate(target, prompt, max_new_tokens=NEW, backend=backend).sequences
    drafting = [
        dict(assistant_model=target, num_assistant_tokens=3),
        dict(prompt_lookup_num_tokens=2),
        dict(assistant_model=target, num_assistant_tokens=3, static_shapes=True, bucket_size=16),
        dict(assistant_model=target, num_assistant_tokens=2, cache_layout="static"),
    ]
    if arch in EARLY_EXIT_ARCHS:
        drafting.append(dict(assistant_early_exit=1, num_assistant_tokens=3))
    for kwargs in drafting:
        result = generate(target, prompt, max_new_tokens=NEW, backend=backend, **kwargs)
        assert torch.equal(result.sequences, plain), (arch, kwargs)
        if "prompt_lookup_num_tokens" not in kwargs or _lookup_could_match(plain[0], prompt.shape[1]):
            assert result.stats.drafted > 0


def _lookup_could_match(sequence: torch.Tensor, prompt_length: int) -> bool:
    """Whether one-token prompt lookup had a match in a round with room to draft: a new token seen before it, not
    one of the last two (the last round has no room). While every draft is rejected each round commits one token,
    so each such token ends some round's context."""
    tokens = sequence.tolist()
    return any(tokens[i] in tokens[:i] for i in range(prompt_length, len(tokens) - 2))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "opt"])
def test_a_quantized_batch_gives_each_row_its_tokens_alone(arch):
    backend, target, _, _, _ = quantized(arch, "int4")
    prompts = torch.randint(3, 100, (3, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(prompts)
    mask[0, :4] = 0
    mask[2, :2] = 0
    result = generate(target, prompts, attention_mask=mask, max_new_tokens=12, backend=backend, pad_token_id=0,
                      assistant_model=target, num_assistant_tokens=3)  # fmt: skip
    for row in range(3):
        alone = prompts[row : row + 1, int((mask[row] == 0).sum()) :]
        expected = generate(target, alone, max_new_tokens=12, backend=backend).sequences[0, alone.shape[1] :]
        assert torch.equal(result.sequences[row, 9:], expected), row


def test_the_report_names_the_precision_and_the_attention():
    _, _, dtype, attention, verify = quantized("llama", "int4")
    if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (4, 53):
        assert dtype == "int4" and "4.53 or newer needed" in attention  # the reason, not a silent fallback
        return
    assert dtype == "int4" and attention == "batch-invariant" and verify == "bit-identical to one-token steps"
    _, _, _, attention, verify = quantized("gemma2", "int4")
    assert "soft-caps" in attention and "sees all rows at once" in verify  # the model's own attention, and why
    assert "experts" in quantized("qwen3_moe", "int4")[4]

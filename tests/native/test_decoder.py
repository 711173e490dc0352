"""The native decoder step (`native.decoder_model`, `native/decoder/decoder.cpp`) is exact by construction:
a verify pass over M rows gives each row's logits bit for bit as M one-token steps (M = 1..16, 1 and 2 threads,
every instruction-set path of the kernels); rollback is a length; against transformers' modeling on the same
kernels (the reference) logits agree to the spread the reference itself shows under a 1e-7 relative change of
its input, and greedy text agrees over a long generation."""

from __future__ import annotations

import pytest
import torch
from decoder_models import VOCAB, prompt, tiny_llama

from assisted_backends.native import decoder_build, extension

pytestmark = pytest.mark.skipif(
    not extension.available() or bool(decoder_build.why_unavailable()),
    reason="the native decoder needs the package's kernels and a compiler",
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_llama(str(tmp_path_factory.mktemp("native")))


def _logits(native, tokens: torch.Tensor, cache=None, **kwargs) -> torch.Tensor:
    with torch.inference_mode():
        return native(tokens, past_key_values=cache, **kwargs).logits


@pytest.mark.parametrize("threads", [1, 2])
def test_a_verify_pass_over_m_rows_equals_m_one_token_steps_bit_for_bit(models, threads):
    _, native = models
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        prefix, rows = prompt(7, 1), prompt(16, 2)
        for m in range(1, 17):
            verify_cache, step_cache = native.new_native_cache(), native.new_native_cache()
            _logits(native, prefix, verify_cache)
            _logits(native, prefix, step_cache)
            verify = _logits(native, rows[:, :m], verify_cache)
            steps = torch.cat([_logits(native, rows[:, i : i + 1], step_cache) for i in range(m)], dim=1)
            assert torch.equal(verify, steps), (m, threads, float((verify - steps).abs().max()))
    finally:
        torch.set_num_threads(before)


def test_every_instruction_set_path_gives_the_same_logits(models, monkeypatch):
    _, native = models
    tokens = prompt(9, 4)
    seen = []
    for isa in extension.runnable_isas():
        monkeypatch.setenv(extension.ISA_VARIABLE, isa)
        seen.append(_logits(native, tokens, native.new_native_cache()))
    assert len(seen) >= 1
    for other in seen[1:]:
        assert torch.equal(other, seen[0])


def test_rollback_is_setting_a_length(models):
    _, native = models
    fresh, used = native.new_native_cache(), native.new_native_cache()
    tokens, rejected = prompt(12, 5), prompt(6, 6)
    _logits(native, tokens[:, :8], fresh)
    _logits(native, tokens[:, :8], used)
    _logits(native, rejected, used)  # a verify pass whose drafts are all rejected
    used.crop(8)
    assert used.get_seq_length() == 8
    assert torch.equal(_logits(native, tokens[:, 8:], used), _logits(native, tokens[:, 8:], fresh))


def test_only_the_kept_rows_reach_the_head(models):
    _, native = models
    tokens = prompt(10, 7)
    every = _logits(native, tokens, native.new_native_cache())
    last = _logits(native, tokens, native.new_native_cache(), logits_to_keep=1)
    assert every.shape == (1, 10, VOCAB) and last.shape == (1, 1, VOCAB)
    assert torch.equal(last[:, 0], every[:, -1])


def test_logits_agree_with_the_reference_within_its_own_input_sensitivity(models):
    """The native step differs from transformers' modeling in the last bits of the norms' sums and SiLU's exp;
    the activations' int8 quantization turns such bits into larger steps. Tolerance: 3x the largest change a
    1e-7 relative change of the embedded input makes in the reference's own logits (stated in docs/native.md), the
    largest over four draws of the change (one draw may move no activation across an int8 step)."""
    reference, native = models
    tokens = prompt(24, 8)
    spread = 0.0
    with torch.inference_mode():
        embedded = reference.get_input_embeddings()(tokens)
        ours = reference(inputs_embeds=embedded).logits
        for seed in range(4):
            nudged = reference(inputs_embeds=embedded * (1 + 1e-7 * torch.randn(embedded.shape,
                               generator=torch.Generator().manual_seed(seed)))).logits  # fmt: skip
            spread = max(spread, float((ours - nudged).abs().max()))
    difference = float((_logits(native, tokens) - ours).abs().max())
    assert 0 < spread and difference <= 3 * spread, (difference, spread)


def test_greedy_text_agrees_with_the_reference_over_a_long_generation(models):
    from assisted_backends import generate
    from assisted_backends.backends.base import BackendOptions
    from assisted_backends.backends.cpu.backend import CPUBackend

    reference, native = models
    backend = CPUBackend(BackendOptions())
    start = prompt(10, 1)
    expected = generate(reference, start, max_new_tokens=120, backend=backend).sequences
    produced = generate(native, start, max_new_tokens=120, backend=backend).sequences
    assert len(set(expected[0, 10:].tolist())) > 20  # a text that does not just repeat one token
    assert torch.equal(produced, expected)


def test_the_switch_keeps_transformers_modeling_and_says_why(models, monkeypatch):
    from assisted_backends.native.decoder_model import NativeCausalLM, native_model

    reference, _ = models
    monkeypatch.setenv(decoder_build.SWITCH_VARIABLE, "off")
    kept = native_model(reference)
    assert kept is reference and "ASSISTED_BACKENDS_NATIVE=off" in kept.step_report
    monkeypatch.setenv(decoder_build.SWITCH_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="ASSISTED_BACKENDS_NATIVE"):
        native_model(reference)
    monkeypatch.delenv(decoder_build.SWITCH_VARIABLE)
    assert isinstance(native_model(reference), NativeCausalLM)


def test_an_uncovered_model_keeps_its_modeling_with_the_reason():
    from architectures import build

    from assisted_backends.backends.base import BackendOptions
    from assisted_backends.backends.cpu.backend import CPUBackend
    from assisted_backends.native.decoder_coverage import why_not_native
    from assisted_backends.native.decoder_model import native_model

    gpt2 = CPUBackend(BackendOptions(dtype="int4")).prepare(build("gpt2", seed=0), "target")
    assert "family (gpt2)" in why_not_native(gpt2)
    assert native_model(gpt2) is gpt2 and "family (gpt2)" in gpt2.step_report

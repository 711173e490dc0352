"""Sliding-window and hybrid models on every path besides the CPU default: the HPU policy (against the
recording FAKE of habana_frameworks), the CUDA graph bookkeeping (against the recording FAKE graph
runtime, on CPU), a draft of another tokenizer, and lossless sampling (chi-square against the exact
enumerated joint, as tests/engine/test_lossless_sampling.py does for Llama)."""

from __future__ import annotations

import pytest
import torch
from any_draft_fixtures import PROMPTS, saved_tokenizers
from architectures import HYBRID_ARCHS, SLIDING_ARCHS, build, refused_here
from fakes import habana_fake
from stats_tools import NEW, PROMPT, V, assert_same_distribution, exact_joint, sample_counts
from test_architecture_matrix import NEW_TOKENS, PROMPT_LENGTH, repetitive_prompt
from test_cuda_graphs import CUDABackendOnCPU
from test_hpu_backend import CPUPlacedHPUBackend
from tiny_models import noisy_copy
from transformers.generation.logits_process import LogitsProcessorList, TopKLogitsWarper

from assisted_backends import generate
from assisted_backends.backends import BackendOptions, registry
from assisted_backends.backends.cuda.graphs import graph_capturable

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOWED = SLIDING_ARCHS[:2] + HYBRID_ARCHS


def skip_if_refused(model_type: str) -> None:
    if refused_here(model_type):
        pytest.skip(f"{model_type} is refused by this transformers (tests/api/test_architecture_matrix.py checks how)")


def reference(model, prompt: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )


@pytest.fixture
def habana():
    registry.discover.cache_clear()
    yield habana_fake.install()
    habana_fake.uninstall()
    registry.discover.cache_clear()


@pytest.mark.parametrize("model_type", WINDOWED)
def test_hpu_policy_static_shapes(habana, model_type, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    skip_if_refused(model_type)
    target = build(model_type, seed=0)
    draft = noisy_copy(target, seed=3, scale=0.05)
    prompt = repetitive_prompt(PROMPT_LENGTH, seed=7)
    expected = reference(target, prompt)
    result = generate(
        target,
        prompt,
        assistant_model=draft,
        max_new_tokens=NEW_TOKENS,
        num_assistant_tokens=3,
        backend=CPUPlacedHPUBackend(BackendOptions(dtype="fp32", bucket_size=16)),
    )
    assert result.stats.cache_layout == "static" and result.stats.accepted < result.stats.drafted
    assert torch.equal(result.sequences, expected), model_type


@pytest.mark.parametrize("model_type", WINDOWED)
def test_cuda_graph_policy(model_type):
    skip_if_refused(model_type)
    target = build(model_type, seed=0)
    if not graph_capturable(target):
        pytest.skip(f"{model_type} has no static cache in this transformers version (the backend falls back)")
    draft = noisy_copy(target, seed=3, scale=0.05)
    prompt = repetitive_prompt(PROMPT_LENGTH, seed=7)
    expected = reference(target, prompt)
    backend = CUDABackendOnCPU()
    result = generate(
        target, prompt, assistant_model=draft, max_new_tokens=NEW_TOKENS, num_assistant_tokens=3, backend=backend
    )
    assert result.stats.cache_layout == "static"
    assert torch.equal(result.sequences, expected), model_type


@pytest.mark.parametrize("model_type", ["gemma3_text", "mistral"])
def test_draft_of_another_tokenizer(tmp_path, model_type):
    skip_if_refused(model_type)
    target_tokenizer, draft_tokenizer = saved_tokenizers(tmp_path)
    target = build(model_type, seed=0, vocab_size=len(target_tokenizer))
    draft = build("qwen2", seed=1, vocab_size=len(draft_tokenizer))
    for prompt in PROMPTS[:3]:
        ids = target_tokenizer(prompt, return_tensors="pt").input_ids
        result = generate(
            target,
            ids,
            assistant_model=draft,
            tokenizer=target_tokenizer,
            assistant_tokenizer=draft_tokenizer,
            max_new_tokens=NEW_TOKENS,
            num_assistant_tokens=3,
        )
        assert result.stats.drafter == "draft_model_translated"
        assert torch.equal(result.sequences, reference(target, ids)), prompt


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["mistral", "gemma3_text"])
def test_lossless_sampling_through_the_window(model_type):
    """Window 2 < prompt + new tokens (7): the window and its rollback shape every sampled position."""
    skip_if_refused(model_type)
    target = build(model_type, seed=0, vocab_size=V, sliding_window=2, initializer_range=0.15)
    draft = build(model_type, seed=1, vocab_size=V, sliding_window=2, initializer_range=0.15)
    warpers = LogitsProcessorList([TopKLogitsWarper(5)])
    counts, acceptance = sample_counts(
        lambda seed: generate(
            target,
            PROMPT,
            assistant_model=draft,
            max_new_tokens=NEW,
            do_sample=True,
            top_k=5,
            num_assistant_tokens=3,
            seed=seed,
        ),
        2000,
    )
    assert 0.1 < acceptance < 0.9, "the pair must both accept and reject for this test to mean anything"
    assert_same_distribution(counts, exact_joint(target, warpers), other=exact_joint(draft, warpers))

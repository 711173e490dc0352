"""SmolLM2's and Gemma 3 270M's real `.gguf` files on the native decoder (`native.decoder_model`): a verify pass
equals the one-token steps bit for bit, every drafter gives the plain greedy output, and greedy text equals
transformers' modeling on the same kernels over a few hundred tokens of real prompts; where it departs, the test
names the first divergence and the reference's top-2 margin there (a near-tie, or a fault).

Run by `.ci/lanes/real_models.sh` (ASSISTED_BACKENDS_REAL_MODELS=1); skipped otherwise."""

from __future__ import annotations

import os

import pytest
import torch

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu import invariant_attention
from assisted_backends.backends.cpu.backend import CPUBackend
from assisted_backends.loading.real_weights import real_model_gguf
from assisted_backends.native.decoder_model import NativeCausalLM, why_unavailable
from assisted_backends.quantized.model import load_gguf_quantized

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("ASSISTED_BACKENDS_REAL_MODELS") != "1",
        reason="real-model lane only: .ci/lanes/real_models.sh (ASSISTED_BACKENDS_REAL_MODELS=1)",
    ),
    pytest.mark.usefixtures("one_thread"),
]
PROMPTS = (
    "The history of the printing press begins",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Here are five tips for staying focused while studying:\n1.",
)
NEW = 300


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma-3-270m"])
def real_model(request):
    loaded = load_gguf_quantized(real_model_gguf(request.param))
    reference = loaded.reference
    invariant_attention.enable(reference)
    why = why_unavailable(reference)
    assert why is None, why
    return reference, NativeCausalLM(reference), loaded.tokenizer


def _divergence(
    reference, native, expected: torch.Tensor, produced: torch.Tensor, start: int
) -> tuple[int, float, float]:
    """Where two greedy sequences part (new-token index), the reference's top-2 logit margin there and the largest
    difference between the two paths' logits there."""
    column = next(i for i in range(start, expected.shape[1]) if expected[0, i] != produced[0, i])
    with torch.inference_mode():
        ours = reference(input_ids=expected[:, :column]).logits[0, -1]
        theirs = native(expected[:, :column]).logits[0, -1]
    top = torch.topk(ours, 2).values
    return column - start, float(top[0] - top[1]), float((ours - theirs).abs().max())


def test_greedy_text_equals_transformers_modeling_up_to_near_ties(real_model):
    """Equal text, or a departure at a near-tie: the reference's top-2 margin there is within twice the two paths'
    logit difference there (each of the two logits may move by it). The departures are printed (pytest -s)."""
    reference, native, tokenizer = real_model
    backend = CPUBackend(BackendOptions())
    for text in PROMPTS:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        expected = generate(reference, ids, max_new_tokens=NEW, backend=backend).sequences
        produced = generate(native, ids, max_new_tokens=NEW, backend=backend).sequences
        if torch.equal(produced, expected):
            print(f"{text!r}: {NEW} new tokens equal")
            continue
        index, margin, difference = _divergence(reference, native, expected, produced, ids.shape[1])
        print(f"{text!r}: first divergence at new token {index}, top-2 margin {margin:.3g}, logit difference "
              f"{difference:.3g}")  # fmt: skip
        assert margin <= 2 * difference, (text, index, margin, difference)


def test_a_verify_pass_computes_the_steps_logits_bit_for_bit(real_model):
    _, native, tokenizer = real_model
    ids = tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        steps_cache, verify_cache = native.new_native_cache(), native.new_native_cache()
        with torch.inference_mode():
            native(ids[:, :3], past_key_values=steps_cache)
            native(ids[:, :3], past_key_values=verify_cache)
            rows = ids[:, 3:]
            steps = torch.cat([native(rows[:, i : i + 1], past_key_values=steps_cache).logits
                               for i in range(rows.shape[1])], 1)  # fmt: skip
            verify = native(rows, past_key_values=verify_cache).logits
        assert torch.equal(steps, verify), threads
    torch.set_num_threads(1)


def test_every_drafter_gives_the_plain_greedy_output(real_model):
    _, native, tokenizer = real_model
    backend = CPUBackend(BackendOptions())
    ids = tokenizer(PROMPTS[1] + "    if n < 2:\n        return n\n", return_tensors="pt")["input_ids"]
    plain = generate(native, ids, max_new_tokens=80, backend=backend).sequences
    for kwargs in (dict(prompt_lookup_num_tokens=4), dict(assistant_model=native, num_assistant_tokens=3),
                   dict(assistant_model=native, num_assistant_tokens=3, cache_layout="static")):  # fmt: skip
        assert torch.equal(generate(native, ids, max_new_tokens=80, backend=backend, **kwargs).sequences, plain), kwargs

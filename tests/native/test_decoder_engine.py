"""The engine drives the native decoder unchanged (`engine.runner.CausalModel`): with prompt lookup, with a draft
model (itself native), on both cache layouts and under static shapes, greedy output equals its plain decoding;
batch rows with left padding equal the same prompts alone; every covered family (Llama, Mistral, Qwen2 biases,
Qwen3 q/k norms, Gemma 3's extra norms, GELU, scaled embedding and local rotary base; sliding windows) steps
natively with verify = steps and the reference's greedy text."""

from __future__ import annotations

import pytest
import torch
import transformers
from decoder_models import prompt, tiny_llama

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu.backend import CPUBackend
from assisted_backends.native import decoder_build, extension

pytestmark = [
    pytest.mark.skipif(
        not extension.available() or bool(decoder_build.why_unavailable()),
        reason="the native decoder needs the package's kernels and a compiler",
    ),  # fmt: skip
    pytest.mark.usefixtures("one_thread", "one_token_matches"),
]
NEW = 40
_OLD_TRANSFORMERS = tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (4, 54)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_llama(str(tmp_path_factory.mktemp("native-engine")), tied=True)


def test_every_drafter_gives_the_plain_greedy_output(models):
    _, native = models
    backend = CPUBackend(BackendOptions())
    start = prompt(12, 3)
    start[0, 6:] = start[0, :6]  # something for prompt lookup to find
    plain = generate(native, start, max_new_tokens=NEW, backend=backend)
    assert "native decoder" in native.step_report
    for kwargs in (
        dict(prompt_lookup_num_tokens=3),
        dict(assistant_model=native, num_assistant_tokens=3),
        dict(assistant_early_exit=1, num_assistant_tokens=3),  # the native step over the first layer
        dict(assistant_model=native, num_assistant_tokens=2, cache_layout="static"),
        dict(assistant_model=native, num_assistant_tokens=3, static_shapes=True, bucket_size=16),
    ):
        result = generate(native, start, max_new_tokens=NEW, backend=backend, **kwargs)
        assert torch.equal(result.sequences, plain.sequences), kwargs
        assert result.stats.drafted > 0, kwargs


def test_batch_rows_with_padding_equal_each_prompt_alone(models):
    _, native = models
    backend = CPUBackend(BackendOptions())
    prompts = prompt(9, 4, batch=3)
    mask = torch.ones_like(prompts)
    mask[0, :4] = 0
    mask[2, :2] = 0
    result = generate(native, prompts, attention_mask=mask, max_new_tokens=12, backend=backend, pad_token_id=0,
                      assistant_model=native, num_assistant_tokens=3)  # fmt: skip
    for row in range(3):
        alone = prompts[row : row + 1, int((mask[row] == 0).sum()) :]
        expected = generate(native, alone, max_new_tokens=12, backend=backend).sequences[0, alone.shape[1] :]
        assert torch.equal(result.sequences[row, 9:], expected), row


@pytest.mark.parametrize("slots", [1, 2])
def test_queue_rows_that_join_equal_each_prompt_alone(models, slots):
    """A queue's joining rows move left as rows realign: every layer's keys must move, not the first one alone (a
    row move stores layer by layer; the cache's length changes only once all are stored)."""
    from assisted_backends.api.generation import AssistedGenerator

    _, native = models
    generator = AssistedGenerator(native)
    prompts = [prompt(length, seed)[0].tolist() for seed, length in enumerate((5, 12, 9, 20, 7))]
    result = generator.generate_many(prompts, slots=slots, max_new_tokens=16, pad_token_id=0)
    for index, ids in enumerate(prompts):
        alone = generator.generate(torch.tensor([ids]), max_new_tokens=16).sequences[0, len(ids) :]
        assert result.tokens[index].tolist() == alone.tolist(), index


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3_text"])
def test_each_covered_family_steps_natively_and_exactly(arch):
    from architectures import build

    from assisted_backends.native.decoder_model import NativeCausalLM

    backend = CPUBackend(BackendOptions(dtype="int4"))
    target = backend.prepare(build(arch, seed=0), "target")  # windows of 12 positions where the family has them
    native = NativeCausalLM(target)
    start, rows = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(2)).split([1, 1])
    steps_cache, verify_cache = native.new_native_cache(), native.new_native_cache()
    with torch.inference_mode():
        native(start, past_key_values=steps_cache)
        native(start, past_key_values=verify_cache)
        steps = torch.cat([native(rows[:, i : i + 1], past_key_values=steps_cache).logits for i in range(6)], 1)
        verify = native(rows[:, :6], past_key_values=verify_cache).logits
    assert torch.equal(steps, verify)
    if arch != "llama" and _OLD_TRANSFORMERS:
        pytest.skip("transformers < 4.54's eager attention drops these families' sliding windows (its own warning): "
                    "no reference for 38 positions")  # fmt: skip
    expected = generate(target, start, max_new_tokens=30, backend=backend).sequences  # 38 positions: past the window
    assert torch.equal(generate(native, start, max_new_tokens=30, backend=backend).sequences, expected)


def test_a_scaled_token_table_is_read_and_scaled_natively_as_the_module_does():
    """Gemma 3 multiplies its embedding rows by √D in fp32: the native code reads and scales them itself (no Python
    embedding a step), bit for bit the module's rows."""
    from architectures import build

    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized import blocks
    from assisted_backends.quantized.linear import QuantizedEmbedding, QuantizedLinear

    target = CPUBackend(BackendOptions(dtype="int4")).prepare(build("gemma3_text", seed=0), "target")
    dense = target.get_input_embeddings()  # a float table here; a .gguf's is quantized, as made below
    table = QuantizedLinear(blocks.from_float(dense.weight, 4), None)
    target.set_input_embeddings(QuantizedEmbedding(table, dense.padding_idx, dense.embed_scale))
    native = NativeCausalLM(target)
    embedding = target.get_input_embeddings()
    assert embedding.embed_scale is not None and float(embedding.embed_scale) != 1.0
    assert native._embed is None  # the native code reads the rows
    tokens = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode(), native.capturing_hidden_states([0]) as captured:
        native(tokens, past_key_values=native.new_native_cache())
    assert torch.equal(captured[0], embedding(tokens).float())

"""Bad input gets a clear error that names the argument and the fix."""

import contextlib

import pytest
import torch
import transformers
from tiny_models import random_prompt, tiny_model

from assisted_backends import generate
from assisted_backends.backends import DeviceUnavailableError


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


def test_unknown_device(target):
    with pytest.raises(ValueError, match=r"device='tpu' is unknown; choose one of: auto, cpu"):
        generate(target, random_prompt(3, 0), max_new_tokens=2, device="tpu")


def test_unavailable_device(target, monkeypatch):
    from assisted_backends.backends.cpu.backend import CPUBackend

    monkeypatch.setattr(CPUBackend, "is_available", classmethod(lambda cls: False))
    with pytest.raises(DeviceUnavailableError, match="device='cpu' is not available"):
        generate(target, random_prompt(3, 0), max_new_tokens=2, device="cpu")


@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_max_new_tokens(target, value):
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        generate(target, random_prompt(3, 0), max_new_tokens=value)


def hf_warns_default_length():
    """transformers 5 warns when `generate` falls back to its default length; 4.51 (the IPEX lane) does not."""
    if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (5, 0):
        return contextlib.nullcontext()
    return pytest.warns(UserWarning, match="default `max_length`")


def test_no_length_anywhere_generates_transformers_default_of_20_new_tokens(target):
    """As model.generate does (with a warning): max_length 20 counted after the prompt."""
    prompt = random_prompt(3, 0)
    with pytest.warns(UserWarning, match="no max_new_tokens or max_length given: generating up to 20 new tokens"):
        ours = generate(target, prompt).sequences
    with hf_warns_default_length(), torch.inference_mode():
        expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False)
    assert ours.shape == (1, 23) and torch.equal(ours, expected)


def test_non_positive_num_assistant_tokens(target):
    with pytest.raises(ValueError, match="num_assistant_tokens must be >= 1"):
        generate(target, random_prompt(3, 0), assistant_model=target, max_new_tokens=2, num_assistant_tokens=0)


def test_empty_prompt(target):
    with pytest.raises(ValueError, match="input_ids is empty"):
        generate(target, torch.zeros((1, 0), dtype=torch.long), max_new_tokens=2)


def test_fully_masked_prompt(target):
    prompt = random_prompt(3, 0)
    with pytest.raises(ValueError, match="masks every token of row 0"):
        generate(target, prompt, attention_mask=torch.zeros_like(prompt), max_new_tokens=2)


def test_prompt_too_long(target):
    with pytest.raises(
        ValueError, match=r"prompt \(250 tokens\) \+ max_new_tokens \(10\) = 260 exceeds the target's 256"
    ):
        generate(target, random_prompt(250, 0), max_new_tokens=10)


def test_different_vocabularies_without_tokenizers(target):
    draft = tiny_model("llama", seed=1, vocab=100)
    with pytest.raises(ValueError, match="assistant_model has a vocabulary of 100 tokens and the target 128"):
        generate(target, random_prompt(3, 0), assistant_model=draft, max_new_tokens=2)


def test_batch_mask_with_a_hole_is_served_as_model_generate_serves_it(target):
    prompt = torch.arange(8).reshape(2, 4) + 3
    mask = torch.tensor([[0, 1, 1, 1], [1, 0, 1, 1]])
    with torch.inference_mode():
        expected = target.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    got = generate(target, prompt, attention_mask=mask, max_new_tokens=4, pad_token_id=0, assistant_model=target)
    assert torch.equal(got.sequences, expected)


def test_empty_batch(target):
    with pytest.raises(ValueError, match="batch size 0"):
        generate(target, torch.zeros((0, 3), dtype=torch.long), max_new_tokens=2)


def test_incompatible_layout_options(target):
    with pytest.raises(ValueError, match="static_shapes=True needs the static cache layout"):
        generate(target, random_prompt(3, 0), max_new_tokens=2, static_shapes=True, cache_layout="dynamic")


def test_unknown_cache_layout(target):
    with pytest.raises(ValueError, match="cache_layout='paged' is not one of"):
        generate(target, random_prompt(3, 0), max_new_tokens=2, cache_layout="paged")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(do_sample=True, temperature=0.0), "temperature must be > 0"),
        (dict(do_sample=True, top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(do_sample=True, top_k=-1), "top_k must be >= 0"),
    ],
)
def test_invalid_sampling_parameters(target, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(target, random_prompt(3, 0), max_new_tokens=2, **kwargs)


def test_non_tensor_prompt(target):
    with pytest.raises(TypeError, match="input_ids must be a torch.LongTensor"):
        generate(target, [1, 2, 3], max_new_tokens=2)


def _tiny_mpt(max_seq_len: int):
    from transformers import MptConfig, MptForCausalLM

    torch.manual_seed(0)
    config = MptConfig(d_model=32, n_heads=4, n_layers=1, max_seq_len=max_seq_len, vocab_size=128, expansion_ratio=2)
    return MptForCausalLM(config).eval()


def test_alibi_table_shorter_than_the_sequence_is_refused(target):
    """MPT sizes its ALiBi table by max_seq_len: refused before generating as the target; as a draft it only
    stops drafting."""
    mpt = _tiny_mpt(64)
    with pytest.raises(ValueError, match=r"the target would attend over 105 cached .* config's max_seq_len is 64"):
        generate(mpt, random_prompt(100, 0), max_new_tokens=5)
    # as a draft it only changes speed: drafting stops where its table ends, the target serves the call
    prompt = random_prompt(100, 0)
    result = generate(target, prompt, assistant_model=mpt, max_new_tokens=5, num_assistant_tokens=2)
    assert "its attention spans at most 64 keys" in result.stats.drafting_stopped
    assert result.stats.drafting_stopped_at == 1 and result.stats.drafted == 0  # at its first round
    assert torch.equal(result.sequences, generate(target, prompt, max_new_tokens=5).sequences)
    with pytest.raises(ValueError, match=r"the target would attend over 256 cached .* max_seq_len is 64"):
        generate(mpt, random_prompt(40, 0), max_new_tokens=5, static_shapes=True, bucket_size=128)
    assert generate(mpt, random_prompt(50, 0), max_new_tokens=14).sequences.shape == (1, 64)


def test_unsupported_generation_config_field_is_named(target):
    from transformers import GenerationConfig

    with pytest.raises(ValueError, match=r"generation_config.num_beams=2 is not supported: beam search"):
        generate(target, random_prompt(3, 0), generation_config=GenerationConfig(max_new_tokens=2, num_beams=2))
    with pytest.raises(ValueError, match=r"generation_config.guidance_scale=1.5 is not supported"):
        generate(target, random_prompt(3, 0), max_new_tokens=2, guidance_scale=1.5)


def test_max_length_without_room_for_new_tokens(target):
    from transformers import GenerationConfig

    with pytest.raises(ValueError, match=r"max_length=3 leaves no room after the 3-token prompt"):
        generate(target, random_prompt(3, 0), generation_config=GenerationConfig(max_length=3))


def test_unknown_generation_keyword(target):
    with pytest.raises(TypeError, match="unexpected keyword argument 'topk'"):
        generate(target, random_prompt(3, 0), max_new_tokens=2, topk=3)

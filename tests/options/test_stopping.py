"""Rule 4: stop exactly at max_new_tokens and at the first EOS inside an accepted span."""

import pytest
import torch
from tiny_models import random_prompt, tiny_model
from transformers import GenerationConfig

from assisted_backends import generate


def _eos_inside_the_greedy_path():
    """A target whose greedy path (without EOS) contains some token late enough to be inside a span."""
    target = tiny_model("llama", seed=0)
    prompt = random_prompt(4, seed=5)
    path = generate(target, prompt, max_new_tokens=30).sequences[0, 4:].tolist()
    eos = next(token for token in path[5:] if token not in path[:5])
    return target, prompt, path, eos


@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_stops_at_first_eos_inside_accepted_span(gamma, layout):
    target, prompt, path, eos = _eos_inside_the_greedy_path()
    expected = path[: path.index(eos) + 1]
    result = generate(
        target,
        prompt,
        assistant_model=target,
        max_new_tokens=30,
        eos_token_id=eos,
        num_assistant_tokens=gamma,
        cache_layout=layout,
    )
    assert result.sequences[0, 4:].tolist() == expected
    with torch.inference_mode():
        reference = target.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=30,
            eos_token_id=eos,
            pad_token_id=0,
            do_sample=False,
        )
    assert reference[0, 4:].tolist() == expected


def test_eos_defaults_from_the_models_generation_config():
    target, prompt, path, eos = _eos_inside_the_greedy_path()
    target.generation_config.eos_token_id = eos
    try:
        result = generate(target, prompt, assistant_model=target, max_new_tokens=30)
    finally:
        target.generation_config.eos_token_id = None
    assert result.sequences[0, -1].item() == eos and result.stats.new_tokens == path.index(eos) + 1


def test_generation_config_is_accepted_and_explicit_arguments_win():
    target, prompt, path, eos = _eos_inside_the_greedy_path()
    config = GenerationConfig(max_new_tokens=9, num_assistant_tokens=2, do_sample=False)
    result = generate(target, prompt, assistant_model=target, generation_config=config)
    assert result.sequences[0, 4:].tolist() == path[:9]
    assert result.stats.per_position_drafted and len(result.stats.per_position_drafted) == 2
    result = generate(target, prompt, generation_config=config, max_new_tokens=3)
    assert result.stats.new_tokens == 3


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 13])
def test_stops_exactly_at_max_new_tokens_with_fixed_shapes(max_new_tokens):
    target = tiny_model("gpt2", seed=0)
    result = generate(
        target,
        random_prompt(3, seed=1),
        assistant_model=target,
        max_new_tokens=max_new_tokens,
        num_assistant_tokens=4,
        static_shapes=True,
    )
    assert result.stats.new_tokens == max_new_tokens == result.sequences.shape[1] - 3

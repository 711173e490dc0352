"""The one-line switch: `assisted_backends.enable(model)` keeps a transformers script's `model.generate`
call and gives the same tokens (greedy), the same return type, and refuses what it cannot honour."""

from __future__ import annotations

import pytest
import torch
from demo_pair_fixtures import demo_pair, prompt_ids
from tiny_models import random_prompt, tiny_model
from transformers import GenerationConfig

import assisted_backends

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "def add(a, b):\n    "


def script(model, draft, tokenizer, **extra):
    """An existing transformers script's generate calls (assisted, prompt lookup, plain, config, dict output)."""
    inputs = tokenizer(PROMPT, return_tensors="pt")
    return [
        model.generate(**inputs, assistant_model=draft, max_new_tokens=24, do_sample=False, **extra),
        model.generate(inputs.input_ids, prompt_lookup_num_tokens=3, max_new_tokens=16, **extra),
        model.generate(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, max_new_tokens=12, **extra),
        model.generate(**inputs, generation_config=GenerationConfig(max_new_tokens=10, repetition_penalty=1.3)),
        model.generate(**inputs, max_new_tokens=20, stop_strings=["self"], tokenizer=tokenizer),
        model.generate(**inputs, max_new_tokens=8, return_dict_in_generate=True).sequences,
    ]


def test_the_same_script_with_and_without_the_line_gives_identical_tokens():
    target, draft, tokenizer = demo_pair()
    with torch.inference_mode():
        before = script(target, draft, tokenizer)
    assisted_backends.enable(target)
    try:
        assert assisted_backends.api.dropin.is_enabled(target)
        after = script(target, draft, tokenizer)
        assert target.generate.last_stats.rounds > 0
    finally:
        assisted_backends.disable(target)
    assert not assisted_backends.api.dropin.is_enabled(target)
    for plain, ours in zip(before, after, strict=True):
        assert isinstance(ours, torch.Tensor) and ours.tolist() == plain.tolist()


def test_a_generation_config_keeps_the_packages_draft_length_choice():
    """transformers 4.x configs carry num_assistant_tokens=20 by default (a setting for its own schedule):
    the drop-in leaves γ to this package's schedule then (at most 8), and keeps a value the caller set."""
    target = tiny_model("llama", seed=0)
    draft = tiny_model("llama", seed=0, hidden=32, layers=1)  # cheap enough for the schedule to draft
    prompt = random_prompt(4, seed=1)
    assisted_backends.enable(target)
    try:  # 100 tokens: enough plain time left for the draft's try to fit the trial budget
        target.generate(prompt, assistant_model=draft, generation_config=GenerationConfig(max_new_tokens=100))
        assert 0 < len(target.generate.last_stats.per_position_drafted) <= 8
        config = GenerationConfig(max_new_tokens=30, num_assistant_tokens=10)
        target.generate(prompt, assistant_model=draft, generation_config=config)
        assert len(target.generate.last_stats.per_position_drafted) == 10 and config.num_assistant_tokens == 10
    finally:
        assisted_backends.disable(target)


def test_return_type_follows_return_dict_in_generate():
    target = tiny_model("llama", seed=0)
    prompt = random_prompt(4, seed=1)
    assisted_backends.enable(target)
    try:
        output = target.generate(prompt, max_new_tokens=3, return_dict_in_generate=True)
        assert type(output).__name__ == "GenerateDecoderOnlyOutput" and output.sequences.shape == (1, 7)
        assert isinstance(target.generate(prompt, max_new_tokens=3), torch.Tensor)
    finally:
        assisted_backends.disable(target)


def test_streamer_reaches_the_loop_through_the_drop_in():
    target, draft, tokenizer = demo_pair()
    puts = []

    class Streamer:
        def put(self, value):
            puts.append(value.reshape(-1).tolist())

        def end(self):
            puts.append("end")

    ids = prompt_ids(tokenizer, PROMPT)
    assisted_backends.enable(target)
    try:
        out = target.generate(ids, assistant_model=draft, max_new_tokens=12, streamer=Streamer())
    finally:
        assisted_backends.disable(target)
    assert puts[0] == ids[0].tolist() and puts[-1] == "end"
    assert [t for put in puts[1:-1] for t in put] == out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_beams=2), "beam search"),
        (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
        (dict(output_hidden_states=True, return_dict_in_generate=True), "output_hidden_states"),
        (dict(negative_prompt_ids=torch.tensor([[1, 2]])), "negative prompts"),
        (dict(inputs_embeds=torch.zeros(1, 2, 8)), "inputs_embeds"),
        (dict(cache_position=torch.arange(4)), "computes cache positions"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(kwargs, match):
    target = tiny_model("llama", seed=0)
    prompt = random_prompt(4, seed=1)
    assisted_backends.enable(target)
    try:
        with pytest.raises((ValueError, NotImplementedError), match=match):
            target.generate(prompt, max_new_tokens=3, **kwargs)
    finally:
        assisted_backends.disable(target)


def test_batches_run_and_defaults_are_checked():
    target = tiny_model("llama", seed=0)
    prompts = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assisted_backends.enable(target, num_assistant_tokens=3)
    try:
        routed = target.generate(prompts, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    finally:
        assisted_backends.disable(target)
    assert torch.equal(routed, expected)
    with pytest.raises(TypeError, match="does not take: not_an_argument"):
        assisted_backends.enable(target, not_an_argument=1)

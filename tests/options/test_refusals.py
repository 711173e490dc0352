"""Every refusal comes from the one table of `options.fields` and holds on every entry point: `generate`, and
`enable(model)` + `model.generate`. An output the package does not return is refused wherever it is asked for
(an argument, a passed config, the model's own config), never ignored."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model
from transformers import GenerationConfig

import assisted_backends
from assisted_backends import generate
from assisted_backends.options import fields

pytestmark = pytest.mark.usefixtures("one_thread")
IDS = torch.tensor([[5, 9, 3, 17]])


@pytest.fixture
def model():
    return tiny_model("llama", 0)


@pytest.mark.parametrize("name", list(fields.REFUSED_OUTPUTS))
@pytest.mark.parametrize("where", ["argument", "passed config", "model config"])
def test_an_output_that_is_not_returned_is_refused_wherever_it_is_asked(model, name, where):
    arguments = {"max_new_tokens": 2}
    if where == "argument":
        arguments[name] = True
    elif where == "passed config":
        arguments["generation_config"] = GenerationConfig(**{name: True})
    else:
        setattr(model.generation_config, name, True)
    for call in (
        lambda: generate(model, IDS, **arguments),
        lambda: assisted_backends.enable(model).generate(IDS, **arguments),
    ):
        with pytest.raises(NotImplementedError, match=f"{name}=True is not supported") as raised:
            call()
        assert fields.REFUSED_OUTPUTS[name] in str(raised.value)
    assisted_backends.disable(model)


@pytest.mark.parametrize("name", ["negative_prompt_ids", "synced_gpus", "custom_generate", "inputs_embeds"])
def test_an_argument_that_cannot_be_served_is_refused_with_its_reason(model, name):
    reason = fields.REFUSED_ARGUMENTS.get(name) or fields.REFUSED_INPUTS[name]
    value = torch.ones(1, 2) if name != "synced_gpus" else True
    for call in (lambda: generate(model, IDS, max_new_tokens=2, **{name: value}),
                 lambda: assisted_backends.enable(model).generate(IDS, max_new_tokens=2, **{name: value})):  # fmt: skip
        with pytest.raises(NotImplementedError, match=f"generate\\({name}=...\\) is not supported") as raised:
            call()
        assert reason in str(raised.value)
    assisted_backends.disable(model)


def test_a_false_flag_is_no_request(model):
    plain = generate(model, IDS, max_new_tokens=3).sequences
    assert torch.equal(generate(model, IDS, max_new_tokens=3, synced_gpus=False, output_attentions=False).sequences,
                       plain)  # fmt: skip


def test_return_dict_follows_the_precedence_of_model_generate(model):
    """The model's config asks for a dict; a passed config that leaves the field at its default does not override
    it (transformers' rule: a passed config's fields override where they differ from the defaults)."""
    model.generation_config.return_dict_in_generate = True
    enabled = assisted_backends.enable(model)
    out = enabled.generate(IDS, generation_config=GenerationConfig(max_new_tokens=2))
    assisted_backends.disable(model)
    expected = model.generate(IDS, generation_config=GenerationConfig(max_new_tokens=2))
    assert type(out).__name__ == type(expected).__name__ == "GenerateDecoderOnlyOutput"
    assert torch.equal(out.sequences, expected.sequences)

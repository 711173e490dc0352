"""`ModelSetup`, the one spelling of the model and device arguments: `generate` and `generate_queue` split them from
the call's options with it, `AssistedGenerator` takes exactly its fields, and `enable` accepts them as defaults."""

from __future__ import annotations

import inspect

import pytest
import torch
from tiny_models import tiny_model

import assisted_backends
from assisted_backends import AssistedGenerator, generate, generate_queue
from assisted_backends.api.generation import ModelSetup

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_generator_takes_exactly_the_setups_fields():
    keywords = set(inspect.signature(AssistedGenerator.__init__).parameters) - {"self", "model"}
    assert keywords == ModelSetup.names()


def test_split_keeps_the_objects_and_leaves_the_options():
    draft = tiny_model("llama", 1)
    setup, options = ModelSetup.split({"assistant_model": draft, "device": "cpu", "max_new_tokens": 3, "seed": 1})
    assert setup.assistant_model is draft and setup.arguments()["assistant_model"] is draft  # not a copy
    assert setup.device == "cpu" and options == {"max_new_tokens": 3, "seed": 1}


def test_every_entry_point_takes_the_setup():
    target, draft = tiny_model("llama", 0), tiny_model("llama", 1)
    ids = torch.tensor([[3, 8, 1, 9]])
    plain = generate(target, ids, max_new_tokens=5).sequences
    assisted = generate(target, ids, assistant_model=draft, device="cpu", threads=1, max_new_tokens=5)
    assert torch.equal(assisted.sequences, plain) and assisted.stats.drafter != "none"
    queued = generate_queue(target, [ids[0]], assistant_model=draft, device="cpu", max_new_tokens=5, pad_token_id=0)
    assert torch.equal(queued.tokens[0], plain[0, 4:])
    enabled = assisted_backends.enable(target, assistant_model=draft, device="cpu")
    assert torch.equal(enabled.generate(ids, max_new_tokens=5), plain)
    assisted_backends.disable(target)
    with pytest.raises(TypeError, match="unexpected keyword argument 'devise'"):
        generate(target, ids, devise="cpu", max_new_tokens=2)

"""Bad input as a new user would type it: one-line errors naming the argument, not torch internals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import VOCAB, random_prompt, tiny_model

from assisted_backends import generate


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 100, -1])
def test_token_ids_outside_the_vocabulary_name_the_argument(target, bad):
    prompt = torch.tensor([[1, 2, bad, 3]])
    with pytest.raises(ValueError, match=rf"input_ids holds token id {bad} .*vocabulary \[0, {VOCAB}\)") as error:
        generate(target, prompt, max_new_tokens=2)
    assert "\n" not in str(error.value)


def test_float_token_ids_are_refused(target):
    with pytest.raises(TypeError, match="input_ids must hold integer token ids"):
        generate(target, torch.tensor([[1.0, 2.0]]), max_new_tokens=2)


@pytest.mark.parametrize("value", [5.5, 5.0, "5", True])
def test_max_new_tokens_must_be_an_int(target, value):
    with pytest.raises(TypeError, match="max_new_tokens must be an int"):
        generate(target, random_prompt(3, seed=0), max_new_tokens=value)


@pytest.mark.parametrize("value", [1.5, 3.0, "7"])
def test_seed_must_be_an_int(target, value):
    with pytest.raises(TypeError, match="seed must be an int"):
        generate(target, random_prompt(3, seed=0), max_new_tokens=2, do_sample=True, seed=value)


def test_num_assistant_tokens_must_be_an_int(target):
    with pytest.raises(TypeError, match="num_assistant_tokens must be an int"):
        generate(target, random_prompt(3, seed=0), assistant_model=target, max_new_tokens=2, num_assistant_tokens=2.5)


def test_integer_types_other_than_int_are_accepted(target):
    prompt = random_prompt(3, seed=0)
    result = generate(target, prompt, max_new_tokens=np.int64(3), seed=np.int32(4))
    assert result.sequences.shape == (1, 6)
    assert generate(target, prompt.int(), max_new_tokens=3).sequences.tolist() == result.sequences.tolist()

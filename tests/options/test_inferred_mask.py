"""A mask transformers infers is transformers' to apply; only a mask the caller passed is refused for masking a row.

Without an `attention_mask`, `model.generate` masks the prompt's pad tokens (`pad_token_id` set, not an EOS id),
and it generates even where that masks a whole row: a one-token prompt whose token is the pad id, found by the
differential fuzzer against `model.generate` (issue 50, item 6). Such a row is served as `model.generate` serves
it (its masked columns are holes, `options.prompt.left_padding`); the same mask passed by the caller is still
refused in one line (`mask_empty_row`).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model

from assisted_backends import generate
from assisted_backends.options.errors import OptionError

NEW = 10
PAD = 0
DRAFTERS = {
    "none": lambda model: {},
    "lookup": lambda model: dict(prompt_lookup_num_tokens=3),
    "draft": lambda model: dict(assistant_model=model, num_assistant_tokens=3),
}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", 0)


def reference(model, prompt: torch.Tensor, **arguments) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(prompt, max_new_tokens=NEW, do_sample=False, pad_token_id=PAD, **arguments)


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize(
    "rows", [[[PAD]], [[PAD, PAD, PAD]], [[PAD, PAD], [PAD, 7]], [[PAD, PAD, PAD], [3, PAD, 5]]], ids=str
)
def test_a_row_of_pad_tokens_without_a_mask_generates_as_model_generate(target, drafter, rows):
    prompt = torch.tensor(rows)
    expected = reference(target, prompt)
    attended = reference(target, prompt, attention_mask=torch.ones_like(prompt))
    assert not torch.equal(expected, attended), "the inferred mask must change the tokens for this test to mean much"
    drafting = DRAFTERS[drafter](target)
    result = generate(target, prompt, max_new_tokens=NEW, do_sample=False, pad_token_id=PAD, **drafting)
    assert torch.equal(result.sequences, expected)


@pytest.mark.parametrize("rows,row", [([[PAD]], 0), ([[5, 9], [PAD, PAD]], 1)])
def test_a_mask_the_caller_passed_that_masks_a_whole_row_is_refused(target, rows, row):
    prompt = torch.tensor(rows)
    mask = (prompt != PAD).long()
    with pytest.raises(OptionError) as raised:
        generate(target, prompt, attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD, prompt_lookup_num_tokens=3)
    expected = f"attention_mask masks every token of row {row}: each prompt needs at least one real token"
    assert str(raised.value) == expected

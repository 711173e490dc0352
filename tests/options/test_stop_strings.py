"""Rule 4: stop strings and custom stopping criteria truncate inside an accepted span exactly where
plain decoding (`model.generate`) stops, with a real trained tokenizer (the demo pair's)."""

from __future__ import annotations

import pytest
import torch
from demo_pair_fixtures import demo_pair, prompt_ids
from transformers import StoppingCriteria, StoppingCriteriaList

from assisted_backends import generate

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "def add(a, b):\n    "
NEW = 48


def _reference(target, ids, **kwargs) -> list[int]:
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False, **kwargs)
    return out[0].tolist()


def _stop_strings_inside_the_text(tokenizer, ids, path: list[int]) -> list[str]:
    """Substrings of the greedy continuation that end inside a token, beyond the first few tokens."""
    text = tokenizer.decode(path[ids.shape[1] :])
    return [text[20:24], text[41:43], text[70:77]]


@pytest.mark.parametrize("layout", ["dynamic", "static"])
@pytest.mark.parametrize("gamma", [2, 5])
def test_stop_strings_stop_where_model_generate_stops(gamma, layout):
    target, draft, tokenizer = demo_pair()
    ids = prompt_ids(tokenizer, PROMPT)
    path = _reference(target, ids)
    for stop in _stop_strings_inside_the_text(tokenizer, ids, path):
        expected = _reference(target, ids, stop_strings=[stop], tokenizer=tokenizer)
        assert len(expected) < len(path), f"{stop!r} must stop the reference early"
        result = generate(
            target,
            ids,
            assistant_model=draft,
            max_new_tokens=NEW,
            num_assistant_tokens=gamma,
            cache_layout=layout,
            stop_strings=stop,
            tokenizer=tokenizer,
        )
        assert result.sequences[0].tolist() == expected, stop
        assert stop in tokenizer.decode(result.sequences[0, ids.shape[1] :])


class _StopAfterToken(StoppingCriteria):
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token  # [B] bool, as transformers' criteria return


def test_custom_stopping_criteria_and_plain_callables_stop_where_model_generate_stops():
    target, draft, tokenizer = demo_pair()
    ids = prompt_ids(tokenizer, PROMPT)
    path = _reference(target, ids)
    token = next(t for t in path[ids.shape[1] + 7 :] if t not in path[ids.shape[1] : ids.shape[1] + 7])
    expected = _reference(target, ids, stopping_criteria=StoppingCriteriaList([_StopAfterToken(token)]))
    assert len(expected) < len(path) and expected[-1] == token
    for criteria in (
        StoppingCriteriaList([_StopAfterToken(token)]),
        [lambda input_ids, scores: bool(input_ids[0, -1] == token)],
    ):
        result = generate(target, ids, assistant_model=draft, max_new_tokens=NEW, stopping_criteria=criteria)
        assert result.sequences[0].tolist() == expected


def test_stop_on_the_first_token_and_with_prompt_lookup():
    target, _, tokenizer = demo_pair()
    ids = prompt_ids(tokenizer, PROMPT)
    first = tokenizer.decode(_reference(target, ids)[ids.shape[1]])
    expected = _reference(target, ids, stop_strings=[first], tokenizer=tokenizer)
    assert len(expected) == ids.shape[1] + 1
    result = generate(
        target, ids, prompt_lookup_num_tokens=3, max_new_tokens=NEW, stop_strings=[first], tokenizer=tokenizer
    )
    assert result.sequences[0].tolist() == expected


def test_stop_strings_without_a_tokenizer_is_a_one_line_error():
    target, _, tokenizer = demo_pair()
    with pytest.raises(ValueError, match="stop_strings needs the target's tokenizer"):
        generate(target, prompt_ids(tokenizer, PROMPT), max_new_tokens=4, stop_strings=["x"])
    with pytest.raises(TypeError, match="stopping_criteria must hold callables"):
        generate(target, prompt_ids(tokenizer, PROMPT), max_new_tokens=4, stopping_criteria=[3])


@pytest.mark.parametrize("static_shapes", [False, True])
def test_criteria_see_the_ids_model_generate_sees_under_bucket_padding(static_shapes):
    target, draft, tokenizer = demo_pair()
    ids = prompt_ids(tokenizer, PROMPT)
    stop_length = ids.shape[1] + 9
    seen = []

    def at_length(input_ids, scores):
        seen.append(input_ids[0, : ids.shape[1]].tolist())
        return input_ids.shape[1] >= stop_length

    expected = _reference(target, ids)[:stop_length]
    result = generate(
        target,
        ids,
        assistant_model=draft,
        max_new_tokens=NEW,
        num_assistant_tokens=3,
        static_shapes=static_shapes,
        bucket_size=16,
        stopping_criteria=[at_length],
    )
    assert result.sequences[0].tolist() == expected
    assert all(prefix == ids[0].tolist() for prefix in seen)  # no bucket padding in front of the prompt

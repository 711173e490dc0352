"""Streaming: the streamer gets the prompt, then only committed tokens, as rounds commit them."""

from __future__ import annotations

import pytest
import torch
from demo_pair_fixtures import demo_pair, prompt_ids
from tiny_models import noisy_copy, random_prompt, tiny_model
from transformers import TextIteratorStreamer, TextStreamer

from assisted_backends import generate

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "def add(a, b):\n    "


class RecordingStreamer:
    """Keeps every `put` (as a list of ids) and counts `end` calls."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ends = 0

    def put(self, value: torch.Tensor) -> None:
        assert value.device.type == "cpu"
        self.puts.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ends += 1

    def streamed(self) -> list[int]:
        return [token for put in self.puts[1:] for token in put]


@pytest.mark.parametrize("layout", ["dynamic", "static"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_only_committed_tokens_are_streamed_with_a_draft_that_gets_rejected(layout, do_sample):
    target = tiny_model("llama", seed=0)
    draft = noisy_copy(target, seed=3, scale=0.3)  # wrong often enough to be rejected
    prompt = random_prompt(5, seed=2)
    streamer = RecordingStreamer()
    result = generate(
        target,
        prompt,
        assistant_model=draft,
        max_new_tokens=40,
        num_assistant_tokens=4,
        cache_layout=layout,
        do_sample=do_sample,
        seed=7 if do_sample else None,
        streamer=streamer,
    )
    stats = result.stats
    assert stats.accepted < stats.drafted, "the draft must get rejections for this test to mean anything"
    assert streamer.puts[0] == prompt[0].tolist() and streamer.ends == 1
    assert streamer.streamed() == result.sequences[0, 5:].tolist()
    assert max(len(put) for put in streamer.puts[1:]) > 1, "rounds commit several tokens at once"
    assert len(streamer.puts) - 1 <= stats.rounds + 1  # one put per round (and the prefill's token)


def test_streamed_text_equals_the_final_text(capsys):
    target, draft, tokenizer = demo_pair()
    ids = prompt_ids(tokenizer, PROMPT)
    iterator = TextIteratorStreamer(tokenizer, skip_prompt=True)
    result = generate(target, ids, assistant_model=draft, max_new_tokens=40, streamer=iterator)
    final = tokenizer.decode(result.sequences[0, ids.shape[1] :])
    assert "".join(iterator) == final and final
    generate(target, ids, assistant_model=draft, max_new_tokens=40, streamer=TextStreamer(tokenizer, skip_prompt=True))
    assert capsys.readouterr().out == final + "\n"


def test_streaming_matches_model_generate_streaming():
    target, draft, tokenizer = demo_pair()
    ids = prompt_ids(tokenizer, PROMPT)
    ours, theirs = RecordingStreamer(), RecordingStreamer()
    generate(target, ids, assistant_model=draft, max_new_tokens=30, streamer=ours)
    with torch.inference_mode():
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False, streamer=theirs)
    assert ours.puts[0] == theirs.puts[0] and ours.streamed() == theirs.streamed()


def test_a_streamer_without_put_or_end_is_refused():
    target = tiny_model("llama", seed=0)
    with pytest.raises(TypeError, match="streamer must have put"):
        generate(target, random_prompt(3, seed=1), max_new_tokens=2, streamer=object())

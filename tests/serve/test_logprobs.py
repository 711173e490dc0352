"""`logprobs` on a real `assisted-serve` (the demo pair, its draft speculating), through the official `openai` client:
chat (`logprobs` + `top_logprobs`) and completions (`logprobs`), whole and streamed. Each token's log-probability
equals, to float tolerance, log softmax of the scores `generate(output_scores=True)` gives the prompt alone without a
draft (speculation off); greedy, it is the top one; the streamed entries are the whole reply's; the ranges are
checked by name. Sampled, they are those of the warped distribution the token was drawn from.
"""

from __future__ import annotations

import math

import pytest
import torch
from serve_process import demo_prompts, running_server

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "class Stack:"}]
TOKENS = 16
# fp32 logits of a verify pass over several positions and rows differ from one-token passes in the last bits (and
# two runs of one request differ where the draft's acceptances, hence the passes' shapes, differ)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def server():
    with running_server("--slots", "4", "--max-waiting", "16") as running:
        yield running


def plain(reference, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """(tokens, log softmax of the processed scores [n, V]) of `generate` on `ids` alone, greedy, no draft."""
    out = reference.generator.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False,
                                       output_scores=True, return_dict_in_generate=True)  # fmt: skip
    scores = torch.log_softmax(torch.stack([s[0] for s in out.scores]).float(), dim=-1)
    return out.sequences[0, len(ids) :].tolist()[: len(out.scores)], scores


def assert_plain(reference, ids: list[int], chosen: list[float], tops: list[list[float]]) -> None:
    """The reply's logprobs (`chosen` per token, `tops` the top values) are the plain decoding's."""
    tokens, scores = plain(reference, ids)
    assert len(chosen) == len(tokens) == TOKENS
    expected = scores.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    assert_close(chosen, expected)
    for top, row in zip(tops, scores):
        assert_close(top, row.topk(len(top)).values.tolist())
        assert top[0] == max(top)


def assert_close(got: list[float], want: list[float]) -> None:
    """Equal lengths, equal values to float tolerance (the draft's rounds change the passes' shapes)."""
    assert len(got) == len(want) and all(math.isclose(a, b, abs_tol=TOLERANCE) for a, b in zip(got, want)), (got, want)


def test_chat_logprobs_whole_and_streamed(client, reference):
    reply = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=TOKENS, temperature=0,
                                           logprobs=True, top_logprobs=5)  # fmt: skip
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == TOKENS
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 5 and entry.bytes == list(entry.token.encode("utf-8"))
        assert entry.logprob == entry.top_logprobs[0].logprob  # greedy: the chosen token is the top one
    assert_plain(reference, reference.ids(messages=MESSAGES), [e.logprob for e in content],
                 [[t.logprob for t in e.top_logprobs] for e in content])  # fmt: skip
    stream = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=TOKENS, temperature=0,
                                            logprobs=True, top_logprobs=5, stream=True)  # fmt: skip
    streamed = [e for chunk in stream if chunk.choices[0].logprobs for e in chunk.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert_close([e.logprob for e in streamed], [e.logprob for e in content])


def test_completion_logprobs_whole_and_streamed(client, reference):
    prompt = demo_prompts(3)[2]
    reply = client.completions.create(model="demo", prompt=prompt, max_tokens=TOKENS, temperature=0, logprobs=3)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == TOKENS
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(TOKENS)]
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert 3 <= len(top) <= 4 and top[token] == value == max(top.values())  # the chosen token is in, at the top
    tops = [sorted(top.values(), reverse=True)[:3] for top in logprobs.top_logprobs]
    assert_plain(reference, reference.ids(prompt), logprobs.token_logprobs, tops)
    stream = client.completions.create(model="demo", prompt=prompt, max_tokens=TOKENS, temperature=0, logprobs=3,
                                       stream=True)  # fmt: skip
    chunks = [chunk.choices[0].logprobs for chunk in stream if chunk.choices and chunk.choices[0].logprobs]
    assert [t for c in chunks for t in c.tokens] == logprobs.tokens
    assert_close([v for c in chunks for v in c.token_logprobs], logprobs.token_logprobs)
    assert [o for c in chunks for o in c.text_offset] == logprobs.text_offset


def test_sampled_logprobs_are_the_warped_distributions(server, client):
    """Sampling with top_k = 2: the entries are those of the distribution sampled from (the two kept tokens' add up to
    one), the tokens the warper removed at the floor (JSON has no −inf); and the draft speculated."""
    reply = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=8, temperature=0.8, seed=3,
                                           logprobs=True, top_logprobs=4, extra_body={"top_k": 2})  # fmt: skip
    for entry in reply.choices[0].logprobs.content:
        values = [top.logprob for top in entry.top_logprobs]
        assert math.isclose(math.exp(values[0]) + math.exp(values[1]), 1.0, abs_tol=1e-4)
        assert values[2:] == [-9999.0, -9999.0] and entry.logprob in values[:2]
    _, text = server.get("/metrics")
    drafted = [line for line in text.splitlines() if line.startswith("assisted_draft_tokens_total")]
    assert drafted and float(drafted[0].split()[1]) > 0


def test_without_logprobs_none_are_sent(client):
    reply = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=4, temperature=0)
    assert reply.choices[0].logprobs is None
    reply = client.completions.create(model="demo", prompt="x = 1", max_tokens=4, temperature=0)
    assert reply.choices[0].logprobs is None


@pytest.mark.parametrize(
    "extra, param",
    [({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
     ({"logprobs": 3}, "logprobs")],
)  # fmt: skip
def test_chat_ranges_are_refused_by_name(client, extra, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=2, extra_body=extra)
    assert raised.value.body["param"] == param

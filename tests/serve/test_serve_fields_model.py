"""The request fields agent clients send, on a real server process (the demo target, suffix decoding, 4 slots):
greedy answers with OpenAI's penalties or transformers' repetition penalty equal plain `generate` with the same
processor, whether the suffix index drafts them or not, and differ from answers without them; `n` greedy choices
are n equal answers, streamed with their indices; `/tokenize` is the server's own tokenization; the startup line
names the drafter that runs."""

from __future__ import annotations

import pytest
from serve_process import demo_prompts, running_server

from assisted_backends.options.penalties import OpenAIPenaltiesLogitsProcessor

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

MAX_TOKENS = 32


@pytest.fixture(scope="module")
def server():
    with running_server("--suffix-cache", "--slots", "4") as running:
        yield running


def _accepted(server) -> float:
    text = server.get("/metrics")[1]
    line = next(line for line in text.splitlines() if line.startswith("assisted_accepted_draft_tokens_total"))
    return float(line.split()[1])


def test_the_startup_line_names_suffix_decoding(server):
    assert any("drafting: suffix decoding" in line for line in server.log), "".join(server.log)


def test_openai_penalties_equal_plain_generate_drafted_or_not(server, client, reference):
    prompt = demo_prompts(5)[4]
    penalty = OpenAIPenaltiesLogitsProcessor(0.6, 0.4, len(reference.ids(prompt)))
    expected = reference.text(prompt, MAX_TOKENS, logits_processor=[penalty])
    assert expected != reference.text(prompt, MAX_TOKENS)  # the penalty changes the answer
    answers, drafted = [], []
    for _ in range(2):  # the second is drafted from the suffix index the first filled
        before = _accepted(server)
        reply = client.completions.create(model="demo", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                          presence_penalty=0.6, frequency_penalty=0.4)  # fmt: skip
        answers.append(reply.choices[0].text)
        drafted.append(_accepted(server) - before)
    assert answers == [expected, expected]
    assert drafted[1] >= MAX_TOKENS // 2, drafted


def test_repetition_penalty_equals_generates(client, reference):
    prompt = demo_prompts(6)[5]
    expected = reference.text(prompt, MAX_TOKENS, repetition_penalty=1.3)
    assert expected != reference.text(prompt, MAX_TOKENS)
    reply = client.completions.create(model="demo", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"repetition_penalty": 1.3})  # fmt: skip
    assert reply.choices[0].text == expected


def test_n_greedy_choices_streamed_are_equal_answers(client, reference):
    messages = [{"role": "user", "content": "class Queue:"}]
    penalty = OpenAIPenaltiesLogitsProcessor(0.0, 0.5, len(reference.ids(messages=messages)))
    expected = reference.text(max_tokens=20, messages=messages, logits_processor=[penalty])
    stream = client.chat.completions.create(model="demo", messages=messages, max_tokens=20, temperature=0, n=3,
                                            frequency_penalty=0.5, stream=True)  # fmt: skip
    texts, roles, finishes = ["", "", ""], set(), set()
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            roles.update([choice.index] if choice.delta.role == "assistant" else [])
            finishes.update([choice.index] if choice.finish_reason else [])
    assert texts == [expected] * 3 and roles == finishes == {0, 1, 2}


def test_tokenize_is_the_servers_tokenization(server, reference):
    prompt = demo_prompts(2)[1]
    tokens = httpx.post(f"{server.url}/tokenize", json={"model": "demo", "prompt": prompt}, timeout=30).json()
    assert tokens["tokens"] == reference.ids(prompt) and tokens["count"] == len(reference.ids(prompt))
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": tokens["tokens"]}, timeout=30).json()
    assert back["content"] == reference.tokenizer.decode(reference.ids(prompt))

"""The request fields agent clients send, on the in-process server with a scripted decoding loop
(tests/serve/scripted_server.py): vendor sampling extras reach the engine, harmless fields are ignored, what cannot
be honoured is refused by name in one 400, penalties become the row's own processors, `n` choices (whole and
streamed, seeds derived per choice), `/tokenize` and `/detokenize` (and keys guard them)."""

from __future__ import annotations

import json
import time

import pytest
from scripted_server import ScriptedLoop, demo_tokenizer, running, scripted_state
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from assisted_backends.options.penalties import OpenAIPenaltiesLogitsProcessor
from assisted_backends.serve.choices import choice_seed

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

ANSWER = "def push(self, item):\n    self.items.append(item)\n"


@pytest.fixture(scope="module")
def tokenizer():
    return demo_tokenizer()


@pytest.fixture
def loop(monkeypatch, tokenizer) -> ScriptedLoop:
    scripted = ScriptedLoop(tokenizer(ANSWER).input_ids, per_round=3)
    monkeypatch.setattr("assisted_backends.api.queue.generate_live", scripted)
    return scripted


def _post(url: str, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=headers, timeout=30)


def _events(response: httpx.Response) -> list:
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_vendor_extras_reach_the_batch_and_harmless_fields_are_ignored(loop, tokenizer):
    body = {"model": "demo", "prompt": "class Stack:", "max_tokens": 6, "temperature": 0.7, "top_k": 20,
            "min_p": 0.05, "user": "u-1", "metadata": {"a": "b"}, "store": False, "service_tier": "auto",
            "parallel_tool_calls": True}  # fmt: skip
    with running(scripted_state(tokenizer)) as (url, _, _):
        response = _post(url, "/v1/completions", body)
        vllm_off = _post(url, "/v1/completions", {**body, "top_k": -1, "min_p": 0})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == tokenizer.decode(tokenizer(ANSWER).input_ids[:6])
    assert loop.calls[0]["top_k"] == 20 and loop.calls[0]["min_p"] == 0.05 and loop.calls[0]["temperature"] == 0.7
    assert vllm_off.status_code == 200 and loop.calls[1]["top_k"] == 0 and loop.calls[1]["min_p"] is None


def test_what_cannot_be_honoured_is_refused_by_name_in_one_400(loop, tokenizer):
    body = {"model": "demo", "prompt": "x", "best_of": 2, "logit_bias": {"5": 1}, "echo": True}
    with running(scripted_state(tokenizer)) as (url, _, _):
        several = _post(url, "/v1/completions", body)
        one = _post(url, "/v1/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": "x"}],
                                                  "logit_bias": {"5": 1}})  # fmt: skip
    assert several.status_code == 400 and not loop.calls
    error = several.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == "logit_bias"
    assert all(name in error["message"] for name in ("best_of", "logit_bias", "echo")) and "\n" not in error["message"]
    assert one.status_code == 400 and one.json()["error"]["param"] == "logit_bias"


def test_penalties_become_the_rows_own_processors(loop, tokenizer):
    body = {"model": "demo", "prompt": "class Stack:", "max_tokens": 4, "temperature": 0}
    prompt_length = len(tokenizer("class Stack:").input_ids)
    with running(scripted_state(tokenizer)) as (url, _, _):
        assert _post(url, "/v1/completions", body).status_code == 200
        penalised = {**body, "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.1}
        assert _post(url, "/v1/completions", penalised).status_code == 200
    assert loop.processors[0] == []
    repetition, openai = loop.processors[1]
    assert isinstance(repetition, RepetitionPenaltyLogitsProcessor) and repetition.penalty == 1.1
    assert isinstance(openai, OpenAIPenaltiesLogitsProcessor)
    assert (openai.presence, openai.frequency, openai.prompt_length) == (0.5, -0.25, prompt_length)
    assert loop.calls[0].get("repetition_penalty", 1.0) == 1.0  # the batch's own stays neutral


def test_n_choices_whole_and_streamed(loop, tokenizer):
    expected = tokenizer.decode(tokenizer(ANSWER).input_ids[:7])
    with running(scripted_state(tokenizer, slots=4, max_waiting=8)) as (url, _, _):
        whole = _post(url, "/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 7, "n": 3,
                                               "temperature": 0})  # fmt: skip
        body = {"model": "demo", "prompt": "x", "max_tokens": 7, "n": 2, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        streamed = _post(url, "/v1/completions", body)
        too_many = _post(url, "/v1/completions", {"model": "demo", "prompt": "x", "n": 9})
    reply = whole.json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert all(c["text"] == expected and c["finish_reason"] == "length" for c in reply["choices"])
    assert reply["usage"] == {"prompt_tokens": 1, "completion_tokens": 21, "total_tokens": 22}
    chunks = _events(streamed)
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {0: expected, 1: expected} and finishes == {0: "length", 1: "length"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 14
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"


def test_seeded_choices_sample_with_derived_seeds(loop, tokenizer):
    body = {"model": "demo", "prompt": "x", "max_tokens": 3, "n": 3, "temperature": 0.8, "seed": 41}
    with running(scripted_state(tokenizer, slots=4, max_waiting=8)) as (url, _, _):
        assert _post(url, "/v1/completions", body).status_code == 200
    assert sorted(call["seed"] for call in loop.calls) == [41, 42, 43]  # a seeded choice runs alone
    assert choice_seed(None, 2) is None and choice_seed(7, 0) == 7
    assert choice_seed((1 << 64) - 1, 1) == 0  # wraps within torch's seed range


def test_tokenize_and_detokenize_in_both_vendors_shapes(loop, tokenizer):
    text = "class Stack:\n    pass"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    with running(scripted_state(tokenizer)) as (url, _, _):
        llama = _post(url, "/tokenize", {"content": text})
        vllm = _post(url, "/tokenize", {"model": "demo", "prompt": text, "add_special_tokens": False})
        back = _post(url, "/detokenize", {"tokens": ids})
        bad = [_post(url, "/tokenize", {"content": 5}), _post(url, "/tokenize", {"text": "x"}),
               _post(url, "/detokenize", {"tokens": [10**7]}), _post(url, "/detokenize", {"tokens": "1 2"}),
               _post(url, "/tokenize", {})]  # fmt: skip
        wrong_model = _post(url, "/tokenize", {"model": "gpt-4", "prompt": "x"})
    assert llama.json()["tokens"] == ids and llama.json()["count"] == len(ids)
    assert vllm.json()["tokens"] == ids and vllm.json()["max_model_len"] > 0
    assert back.json() == {"content": text, "prompt": text}
    assert [r.status_code for r in bad] == [400] * 5
    assert [r.json()["error"]["param"] for r in bad] == ["content", "text", "tokens", "tokens", "content"]
    assert wrong_model.status_code == 404


def test_keys_guard_tokenize(loop, tokenizer):
    with running(scripted_state(tokenizer, keys=("k-1",))) as (url, _, _):
        refused = _post(url, "/tokenize", {"content": "x"})
        allowed = _post(url, "/tokenize", {"content": "x"}, Authorization="Bearer k-1")
        detokenize = _post(url, "/detokenize", {"tokens": [5]})
    assert refused.status_code == 401 and detokenize.status_code == 401
    assert allowed.status_code == 200 and allowed.json()["tokens"]


def test_a_client_that_leaves_cancels_every_choice(monkeypatch, tokenizer):
    scripted = ScriptedLoop(tokenizer(ANSWER).input_ids, per_round=1, round_s=0.02)
    monkeypatch.setattr("assisted_backends.api.queue.generate_live", scripted)
    body = {"model": "demo", "prompt": "x", "max_tokens": 5000, "n": 3, "temperature": 0, "stream": True}
    with running(scripted_state(tokenizer, slots=4, max_waiting=8)) as (url, _, _):
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as response:
            next(response.iter_lines())  # the first chunk, then the client leaves
        deadline = time.monotonic() + 10
        while len(scripted.cancelled) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert sorted(row for row, _ in scripted.cancelled) == [0, 1, 2]
    assert all(count < 5000 for _, count in scripted.cancelled)

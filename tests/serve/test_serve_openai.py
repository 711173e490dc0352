"""`assisted-serve` driven as clients drive it: a real server process on a loopback port (the demo pair, its draft
speculating, 16 slots), the official `openai` client, streaming and not, chat and completions; every greedy
answer compared with `assisted_backends.generate` on the same prompt alone (tests/serve/serve_process.py)."""

from __future__ import annotations

import concurrent.futures
import json
import time

import pytest
from serve_process import demo_prompts, running_server

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server():
    with running_server("--slots", "16", "--max-waiting", "64") as running:
        yield running


def _complete(client, prompt: str, max_tokens: int, **options) -> tuple[str, object]:
    reply = client.completions.create(model="demo", prompt=prompt, max_tokens=max_tokens, temperature=0, **options)
    return reply.choices[0].text, reply


def test_models_health_and_metrics(server, client):
    assert [model.id for model in client.models.list().data] == ["demo"]
    status, health = server.get("/health")
    assert status == 200 and health["slots"] == 16 and health["busy"] == 0
    status, text = server.get("/metrics")
    assert status == 200 and "assisted_slots 16.0" in text and "assisted_queue_depth" in text


def test_completion_equals_generate_alone(client, reference):
    prompt = demo_prompts(3)[2]
    text, reply = _complete(client, prompt, 24)
    assert text == reference.text(prompt, 24)
    assert reply.usage.prompt_tokens == len(reference.ids(prompt))
    assert reply.usage.completion_tokens == 24 and reply.choices[0].finish_reason == "length"


def test_streamed_completion_equals_whole(client, reference):
    prompt = demo_prompts(2)[1]
    stream = client.completions.create(model="demo", prompt=prompt, max_tokens=30, temperature=0, stream=True,
                                       stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == reference.text(prompt, 30)
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 30 and not chunks[-1].choices
    assert len([chunk for chunk in chunks if chunk.choices and chunk.choices[0].text]) > 1  # it did stream


def test_chat_whole_and_streamed(client, reference):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "class Stack:"}]
    expected = reference.text(max_tokens=20, messages=messages)
    reply = client.chat.completions.create(model="demo", messages=messages, max_completion_tokens=20, temperature=0)
    assert reply.choices[0].message.content == expected and reply.choices[0].message.role == "assistant"
    assert reply.usage.prompt_tokens == len(reference.ids(messages=messages))
    stream = client.chat.completions.create(model="demo", messages=messages, max_tokens=20, temperature=0,
                                            stream=True)  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


def test_sixteen_concurrent_clients_get_their_answers_alone(server, client, reference):
    """16 clients at once, mixed prompt lengths (7-227 tokens) and limits (4-32): each request beside up to 15
    others in one batch, joining as they arrive; each text is the one `generate` makes of that prompt alone."""
    prompts = demo_prompts(16)
    limits = [4 + (i * 11) % 29 for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda pair: _complete(client, *pair)[0], zip(prompts, limits)))
    for prompt, limit, answer in zip(prompts, limits, answers):
        assert answer == reference.text(prompt, limit)
    _, text = server.get("/metrics")
    joined = [line for line in text.splitlines() if line.startswith("assisted_draft_tokens_total")]
    assert joined and float(joined[0].split()[1]) > 0  # the draft speculated for these rows


def test_seeded_sampling_is_reproducible(client):
    prompt = demo_prompts(1)[0]
    first, second = (
        client.completions.create(model="demo", prompt=prompt, max_tokens=24, temperature=0.9, top_p=0.95, seed=7)
        for _ in range(2)
    )
    assert first.choices[0].text == second.choices[0].text
    assert first.usage.completion_tokens == second.usage.completion_tokens


def test_stop_string_ends_the_text_before_it(client, reference):
    prompt = demo_prompts(4)[3]
    full = reference.text(prompt, 40)
    stop = full[12:15]
    cut = full.index(stop)
    text, reply = _complete(client, prompt, 40, stop=[stop, "never appears \x00"])
    assert text == full[:cut] and reply.choices[0].finish_reason == "stop"
    tokens = reference.tokens(reference.ids(prompt), 40)
    count = next(n for n in range(1, 41) if stop in reference.tokenizer.decode(tokens[:n], skip_special_tokens=True))
    assert reply.usage.completion_tokens == count
    stream = client.completions.create(model="demo", prompt=prompt, max_tokens=40, temperature=0, stop=stop,
                                       stream=True)  # fmt: skip
    assert "".join(chunk.choices[0].text for chunk in stream) == full[:cut]


BAD_BODIES = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"model": "demo"}), 400, "prompt"),
    (json.dumps({"model": "other", "prompt": "x"}), 404, "model"),
    (json.dumps({"prompt": "x"}), 400, "model"),
    (json.dumps({"model": "demo", "prompt": "x", "max_tokens": -3}), 400, "max_tokens"),
    (json.dumps({"model": "demo", "prompt": "x", "max_tokens": 10**12}), 400, "max_tokens"),
    (json.dumps({"model": "demo", "prompt": "x", "max_tokens": "ten"}), 400, "max_tokens"),
    (json.dumps({"model": "demo", "prompt": "x", "max_tokens": True}), 400, "max_tokens"),
    (json.dumps({"model": "demo", "prompt": "x", "temperature": -1}), 400, "temperature"),
    (json.dumps({"model": "demo", "prompt": "x", "temperature": "hot"}), 400, "temperature"),
    (json.dumps({"model": "demo", "prompt": "x", "top_p": 0}), 400, "top_p"),
    (json.dumps({"model": "demo", "prompt": "x", "n": 17}), 400, "n"),
    (json.dumps({"model": "demo", "prompt": "x", "n": 0}), 400, "n"),
    (json.dumps({"model": "demo", "prompt": "x", "frequency_penalty": 2.5}), 400, "frequency_penalty"),
    (json.dumps({"model": "demo", "prompt": "x", "presence_penalty": "1"}), 400, "presence_penalty"),
    (json.dumps({"model": "demo", "prompt": "x", "repetition_penalty": 0}), 400, "repetition_penalty"),
    (json.dumps({"model": "demo", "prompt": "x", "top_k": -2}), 400, "top_k"),
    (json.dumps({"model": "demo", "prompt": "x", "min_p": 1.5}), 400, "min_p"),
    (json.dumps({"model": "demo", "prompt": "x", "stop": 3}), 400, "stop"),
    (json.dumps({"model": "demo", "prompt": "x", "logprobs": 6}), 400, "logprobs"),
    (json.dumps({"model": "demo", "prompt": "x", "bogus": 1}), 400, "bogus"),
    (json.dumps({"model": "demo", "prompt": [5, -1]}), 400, "prompt"),
    (json.dumps({"model": "demo", "prompt": [10**9]}), 400, "prompt"),
    (json.dumps({"model": "demo", "prompt": {"a": 1}}), 400, "prompt"),
    (json.dumps({"model": "demo", "prompt": "x", "stream_options": {"include_usage": True}}), 400, "stream_options"),
    (json.dumps({"model": "demo", "prompt": "x" * 10_000_000}), 400, "prompt"),
    # hostile: past Python's 4,300-digit int conversion, nesting past the recursion limit, out-of-range seeds, huge
    # strings (each a plain 500 before)
    ('{"model": "demo", "prompt": "x", "max_tokens": ' + "9" * 5000 + "}", 400, "max_tokens"),
    ('{"model": "demo", "prompt": [' + "7" * 4301 + "]}", 400, "prompt"),
    ('{"model": "demo", "prompt": ' + "[" * 100_000 + "}", 400, "prompt"),
    ('{"model": "demo", "prompt": "x", "stop": ' + "[" * 50_000 + "1" + "]" * 50_000 + "}", 400, "stop"),
    (json.dumps({"model": "demo", "prompt": "x", "seed": 10**30}), 400, "seed"),
    (json.dumps({"model": "demo", "prompt": "x", "stop": ["y" * 100_000]}), 400, "stop"),
    (json.dumps({"model": "demo", "prompt": "x", "temperature": [0.5]}), 400, "temperature"),
]


@pytest.mark.parametrize("body, status, param", BAD_BODIES, ids=[f"{i}" for i in range(len(BAD_BODIES))])
def test_bad_bodies_get_openai_errors(server, body, status, param):
    response = httpx.post(f"{server.base_url}/completions", content=body, timeout=60,
                          headers={"Content-Type": "application/json"})  # fmt: skip
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert "\n" not in error["message"] and (param is None or param in error["message"])


CHAT_BAD = [
    ({"model": "demo"}, "messages"),
    ({"model": "demo", "messages": []}, "messages"),
    ({"model": "demo", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": "demo", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": "demo", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools[0].function"),
    ({"model": "demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
      "max_completion_tokens": 4}, "max_completion_tokens"),
]  # fmt: skip


@pytest.mark.parametrize("body, param", CHAT_BAD, ids=[f"{i}" for i in range(len(CHAT_BAD))])
def test_bad_chat_bodies(server, body, param):
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_the_client_sees_errors_as_exceptions(client):
    with pytest.raises(openai.BadRequestError, match="n: must be <= 16"):
        client.completions.create(model="demo", prompt="x", n=30)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")


def _wait_idle(server, seconds: float = 10.0) -> dict:
    """Poll /health until no slot is busy and nothing waits (or `seconds` pass); the last health body."""
    deadline = time.monotonic() + seconds
    while True:
        health = server.get("/health")[1]
        if (health["busy"] == 0 and health["waiting"] == 0) or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def test_disconnected_streams_free_their_slots(server):
    """Clients that read a few chunks of a long stream and leave: their rows end within a round, and the
    server goes on answering exactly."""
    prompts = demo_prompts(6)
    for prompt in prompts[:4]:
        body = {"model": "demo", "prompt": prompt, "max_tokens": 3000, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert [next(lines) for _ in range(4)]
    health = _wait_idle(server)
    assert health["busy"] == 0 and health["waiting"] == 0


def test_disconnected_plain_request_frees_its_slot(server):
    body = {"model": "demo", "prompt": demo_prompts(1)[0], "max_tokens": 3000, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
    assert _wait_idle(server)["busy"] == 0


def test_soak_leaks_no_slot_and_no_memory(server):
    """Bursts of 70 short requests from 8 clients, a tenth of them streams dropped after their first chunk: no slot
    stays busy, nothing waits, and resident memory (read once the server is idle) does not climb burst after burst.

    A leak climbs every burst; a new high-water mark of the allocator does not repeat (a CI run read 530, 529, then
    565 MB, read while dropped streams could still be running). So after two warm-up bursts (+27 MiB from the first
    to the second, measured), a third that ends more than 16 MiB above every earlier reading gets a fourth, and only
    a climb in both fails (a leak above ~240 KiB a request)."""
    prompts = demo_prompts(8)
    url = f"{server.base_url}/completions"

    def one(i: int) -> int:
        body = {"model": "demo", "prompt": prompts[i % 8], "max_tokens": 1 + i % 6, "temperature": 0}
        if i % 10 == 0:
            with httpx.stream("POST", url, json={**body, "stream": True, "max_tokens": 200}, timeout=60) as response:
                next(response.iter_lines())
            return 200
        return httpx.post(url, json=body, timeout=60).status_code

    def burst_then_rss(index: int) -> int:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert set(pool.map(one, range(70 * index, 70 * index + 70))) == {200}
        health = _wait_idle(server)
        assert health["busy"] == 0 and health["waiting"] == 0, health
        return server.rss_kib()

    def climbed(i: int) -> bool:
        return sizes[i] - max(sizes[:i]) > 16 * 1024

    sizes = [burst_then_rss(0), burst_then_rss(1), burst_then_rss(2)]  # two bursts warm caches and pools up
    if climbed(2):
        sizes.append(burst_then_rss(3))
    print("resident KiB after each 70 requests, once idle:", sizes)
    message = f"resident memory climbed more than 16 MiB in two bursts of 70 requests in a row: {sizes} KiB"
    assert not (climbed(2) and climbed(3)), message
    _, metrics = server.get("/metrics")
    assert "assisted_slots_busy 0.0" in metrics and "assisted_queue_depth 0.0" in metrics

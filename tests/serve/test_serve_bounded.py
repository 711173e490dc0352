"""A server with speculation off, one slot and a waiting queue of two: the same greedy answers as the speculating
server and as `generate`; a burst past the queue's bound answered 429 with Retry-After; SIGTERM finishes the
stream in flight, refuses new connections and exits 0."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time

import pytest
from serve_process import Reference, demo_prompts, running_server

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server():
    with running_server("--no-assisted", "--slots", "1", "--max-waiting", "2") as running:
        yield running


def test_speculation_off_gives_the_same_text(server):
    reference = Reference()
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    for prompt, limit in zip(demo_prompts(3), (9, 31, 17)):
        reply = client.completions.create(model="demo", prompt=prompt, max_tokens=limit, temperature=0)
        assert reply.choices[0].text == reference.text(prompt, limit)
    _, metrics = server.get("/metrics")
    assert "assisted_draft_tokens_total 0.0" in metrics


def test_a_burst_past_the_queue_bound_is_refused_with_429(server):
    """One slot, two waiting: of 8 simultaneous long requests at least 5 are refused at once, in the OpenAI shape,
    with Retry-After; the ones admitted finish."""
    body = {"model": "demo", "prompt": demo_prompts(1)[0], "max_tokens": 60, "temperature": 0}
    barrier = threading.Barrier(8)

    def post(_):
        barrier.wait()
        return httpx.post(f"{server.base_url}/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(post, range(8)))
    refused = [r for r in responses if r.status_code == 429]
    admitted = [r for r in responses if r.status_code == 200]
    assert len(refused) >= 5 and len(refused) + len(admitted) == 8 and admitted
    for response in refused:
        assert int(response.headers["Retry-After"]) >= 1
        assert response.json()["error"]["code"] == "queue_full"
    texts = {r.json()["choices"][0]["text"] for r in admitted}
    assert len(texts) == 1  # the same prompt: the same answer, whenever it ran
    status, health = server.get("/health")
    assert health["busy"] == 0 and health["waiting"] == 0


def test_sigterm_finishes_the_stream_in_flight_then_exits(server):
    """Last in this module: it stops the server."""
    body = {"model": "demo", "prompt": demo_prompts(1)[0], "max_tokens": 120, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/health", timeout=5)
        rest = [line for line in lines if line.startswith("data: ")]
    chunks = [json.loads(line[6:]) for line in [first, *rest[:-1]]]
    assert rest[-1] == "data: [DONE]"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert server.process.wait(60) == 0
    assert "stopped: every request in flight finished" in "".join(server.log)

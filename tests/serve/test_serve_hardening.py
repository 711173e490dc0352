"""Nothing a client sends stalls or crashes the server (tests/serve/scripted_server.py: the real app and engine on a
scripted decoding loop, uvicorn on a thread): a stream whose reader stops costs bounded memory and is ended at the
send deadline; a stalled upload gets 408; connections past the cap get 503; shutdown has a deadline; an engine
thread that dies fails its requests (500), turns /health to 503 and stops the server; a full queue answers 429
before tokenizing; each tokenizer copy is used by one thread; detokenization is linear in the answer."""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import pytest
from scripted_server import CallLog, LoggedTokenizer, ScriptedLoop, demo_tokenizer, running, scripted_state

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def tokenizer():
    return demo_tokenizer()


@pytest.fixture
def script(monkeypatch, tokenizer):
    """Install a `ScriptedLoop` as the engine's decoding loop: `script(**options)` returns it."""

    def install(**options) -> ScriptedLoop:
        loop = ScriptedLoop(tokenizer("def stack_push(self, item):\n    self.items.append(item)\n").input_ids,
                            **options)  # fmt: skip
        monkeypatch.setattr("assisted_backends.api.queue.generate_live", loop)
        return loop

    return install


def _body(max_tokens: int, stream: bool = False, prompt: str = "class Stack:") -> dict:
    return {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _raw_request(url: str, body: bytes, headers: str = "", receive_buffer: int | None = None) -> socket.socket:
    """A connection that sent a POST to /v1/completions (`headers`: extra header lines) and reads nothing yet."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect((host, int(port)))
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + body)
    return sock


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """(status, body) of a plain response with a Content-Length."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += sock.recv(4096)
    return int(head.split()[1]), body


def test_a_stream_whose_reader_stops_costs_bounded_memory_and_ends_at_the_send_deadline(script, tokenizer):
    """The reader takes the first bytes, then stops: the engine goes on for 40,000 tokens at 200 a round. The
    handler keeps only the latest state (no copy of the answer per round: that would be ~150 MB here), and once
    the client has taken nothing for the send deadline, the stream ends and the row is cancelled."""
    loop = script(per_round=200, round_s=0.01)
    state = scripted_state(tokenizer, send_timeout_s=1.0)
    with running(state, send_buffer=4096) as (url, _, _):
        before = _rss_kib()
        body = json.dumps(_body(40_000, stream=True)).encode()
        client = _raw_request(url, body, receive_buffer=4096)
        assert client.recv(256).startswith(b"HTTP/1.1 200")
        cancelled = _wait(lambda: bool(loop.cancelled), 15)
        grown = _rss_kib() - before
        client.close()
    assert cancelled, "the stalled stream's row was never cancelled"
    assert loop.cancelled[0][1] < 40_000
    assert grown < 50 * 1024, f"resident memory grew {grown} KiB while the reader was stalled"


def test_a_stalled_upload_gets_408_and_connections_past_the_cap_get_503(script, tokenizer):
    script()
    state = scripted_state(tokenizer, body_timeout_s=0.5, max_connections=3)
    with running(state) as (url, _, _):
        host, port = url.removeprefix("http://").split(":")
        stalled = socket.create_connection((host, int(port)))
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n{\"model\": ")  # fmt: skip
        status, body = _read_response(stalled)
        assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
        stalled.close()
        idle = [socket.create_connection((host, int(port))) for _ in range(3)]
        time.sleep(0.2)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 503  # the cap: 3 connections
        for connection in idle:
            connection.close()
        assert _wait(lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200, 10)


def test_shutdown_has_a_deadline(script, tokenizer):
    """A stream whose reader stalled, with a long send deadline: SIGTERM's shutdown still ends within its own
    deadline (the request is cancelled)."""
    loop = script(per_round=200, round_s=0.01)
    state = scripted_state(tokenizer, send_timeout_s=600, shutdown_timeout_s=1.0)
    with running(state, send_buffer=4096) as (url, server, thread):
        client = _raw_request(url, json.dumps(_body(150_000, stream=True)).encode(), receive_buffer=4096)
        assert client.recv(256).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)
        began = time.monotonic()
        server.should_exit = True
        thread.join(15)
        took = time.monotonic() - began
        client.close()
    assert not thread.is_alive() and took < 8, f"shutdown took {took:.1f} s"
    assert _wait(lambda: bool(loop.cancelled), 10) and loop.cancelled[0][1] < 150_000


class EngineCrash(BaseException):
    """Not an `Exception`: it ends the engine thread (as SystemExit from a library would)."""


def test_an_engine_thread_that_dies_fails_its_requests_and_stops_the_server(script, tokenizer):
    script(fault=EngineCrash("boom"))
    state = scripted_state(tokenizer)
    with running(state) as (url, server, thread):
        response = httpx.post(f"{url}/v1/completions", json=_body(8), timeout=30)
        assert response.status_code == 500
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and "EngineCrash: boom" in error["message"]
        assert server.should_exit  # the server shuts down: the process exits nonzero (runner.ENGINE_FAILED)
        thread.join(15)
        assert not thread.is_alive()
    assert state.engine.failure is not None


def test_health_says_503_once_the_engine_failed(script, tokenizer):
    from assisted_backends.serve.app import build_app

    script(fault=EngineCrash("boom"))
    state = scripted_state(tokenizer)
    app = build_app(state)
    state.engine.start()
    transport = httpx.ASGITransport(app=app)

    async def scenario():
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = await client.post("/v1/completions", json=_body(4))
            health = await client.get("/health")
            later = await client.post("/v1/completions", json=_body(4))
            return first, health, later

    import asyncio

    first, health, later = asyncio.run(scenario())
    assert first.status_code == 500
    assert health.status_code == 503 and health.json()["status"] == "failed"
    assert later.status_code == 503 and later.json()["error"]["code"] == "engine_failed"


def test_a_full_queue_answers_429_before_tokenizing(script, tokenizer):
    script(per_round=1, round_s=0.05)
    log = CallLog()
    state = scripted_state(LoggedTokenizer(tokenizer, log), slots=1, max_waiting=1)
    with running(state) as (url, _, _):
        with httpx.Client(timeout=30) as first, httpx.Client(timeout=30) as second:
            with first.stream("POST", f"{url}/v1/completions", json=_body(2000, stream=True)) as running_one:
                assert running_one.status_code == 200
                with second.stream("POST", f"{url}/v1/completions", json=_body(2000, stream=True)) as waiting:
                    assert waiting.status_code == 200
                    assert _wait(lambda: httpx.get(f"{url}/health", timeout=30).json()["waiting"] == 1, 30)
                    encoded = log.count("encode")
                    refused = httpx.post(f"{url}/v1/completions", json=_body(4, prompt="x " * 5000), timeout=30)
                    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
                    assert log.count("encode") == encoded, "the refused prompt was tokenized"


def test_each_tokenizer_copy_is_used_by_one_thread(script, tokenizer):
    """Prompts are tokenized on the tokenizing thread and answers detokenized on the event loop: each on its own
    copy (a fast tokenizer used by two threads at once raises "Already borrowed")."""
    script(per_round=3)
    log = CallLog()
    state = scripted_state(LoggedTokenizer(tokenizer, log), slots=4, max_waiting=16)
    with running(state) as (url, _, _):
        import concurrent.futures

        def one(i: int) -> int:
            return httpx.post(f"{url}/v1/completions", json=_body(30, stream=i % 2 == 0), timeout=30).status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert set(pool.map(one, range(16))) == {200}
    assert log.count("encode") >= 16 and log.count("decode") > 16
    shared = {instance: threads for instance, threads in log.threads_per_instance().items() if len(threads) > 1}
    assert not shared, f"tokenizer instances used from several threads: {shared}"


def test_detokenization_is_incremental_and_exact(tokenizer):
    """An answer of n tokens delivered a few at a time decodes O(n) tokens in all (the whole text once at the end,
    a window of a few tokens per token), and the text sent is the whole decoding's."""
    from assisted_backends.serve.text import TextTracker

    log = CallLog()
    counted = LoggedTokenizer(tokenizer, log)
    decoded = [0]
    inner_decode = counted.decode

    def counting_decode(tokens, **options):
        decoded[0] += len(tokens)
        return inner_decode(tokens, **options)

    counted.decode = counting_decode
    text = Path(__file__).read_text(encoding="utf-8") * 2 + " héllo wörld 日本語 🙂"
    ids = tokenizer(text).input_ids[:3000]
    rng = random.Random(0)
    tracker = TextTracker(counted, (), frozenset(), len(ids) + 1)
    sent, at = "", 0
    while at < len(ids):
        step = rng.randint(1, 6)
        sent += tracker.update(ids[at : at + step])
        at += step
    sent += tracker.update([], final=True)
    assert sent == tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded[0] < 12 * len(ids), f"{decoded[0]} tokens decoded for an answer of {len(ids)}"


def test_incremental_stop_strings_cut_and_count_as_whole_decoding(tokenizer):
    from assisted_backends.serve.text import TextTracker

    ids = tokenizer("def push(self, item):\n    self.items.append(item)\n    return len(self.items)\n").input_ids
    full = tokenizer.decode(ids, skip_special_tokens=True)
    for stop in ("append", "\n    return", "items)"):
        tracker = TextTracker(tokenizer, (stop,), frozenset(), 1000)
        sent = ""
        for token in ids:
            sent += tracker.update([token])
            if tracker.finished:
                break
        count = next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n], skip_special_tokens=True))
        assert sent == full[: full.index(stop)] and tracker.finish_reason == "stop"
        assert tracker.completion_tokens == count

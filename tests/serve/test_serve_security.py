"""Keys, browsers and tenants: with `--api-key` / `--api-key-file`, every /v1 route and /metrics answer 401 in
OpenAI's shape without a valid `Authorization: Bearer` key (/health stays open); a body not declared JSON gets 415
(a web page's `text/plain` POST); CORS headers only for `--cors-origins`; each key has its own suffix-decoding
index, so key A's text does not raise key B's acceptance (a real server process on the demo target)."""

from __future__ import annotations

import asyncio
import time

import pytest
from scripted_server import ScriptedLoop, demo_tokenizer, scripted_state
from serve_process import demo_prompts, running_server

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def tokenizer():
    return demo_tokenizer()


def _ask(state, requests: list[tuple[str, str, dict]]) -> list:
    """Run `requests` ((method, path, httpx options)) against `state`'s app in process, in order."""
    from assisted_backends.serve.app import build_app

    app = build_app(state)
    state.engine.start()

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            return [await client.request(method, path, **options) for method, path, options in requests]

    try:
        return asyncio.run(scenario())
    finally:
        state.engine.stop(5)


BODY = {"model": "demo", "prompt": "class Stack:", "max_tokens": 3, "temperature": 0}


def test_keys_guard_every_v1_route_and_metrics(monkeypatch, tokenizer):
    monkeypatch.setattr("assisted_backends.api.queue.generate_live", ScriptedLoop(tokenizer("x = 1").input_ids))
    state = scripted_state(tokenizer, keys=("alpha-key", "beta-key"))
    good = {"Authorization": "Bearer beta-key"}
    refused = [
        ("GET", "/v1/models", {}),
        ("POST", "/v1/completions", {"json": BODY}),
        ("POST", "/v1/chat/completions", {"json": BODY, "headers": {"Authorization": "Bearer wrong"}}),
        ("POST", "/v1/completions", {"json": BODY, "headers": {"Authorization": "Basic alpha-key"}}),
        ("GET", "/metrics", {}),
        ("GET", "/v1/nowhere", {}),
    ]
    allowed = [
        ("GET", "/health", {}),
        ("GET", "/v1/models", {"headers": good}),
        ("POST", "/v1/completions", {"json": BODY, "headers": {"Authorization": "bearer alpha-key"}}),
        ("GET", "/metrics", {"headers": good}),
    ]
    responses = _ask(state, refused + allowed)
    for response in responses[: len(refused)]:
        assert response.status_code == 401, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key"
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert [r.status_code for r in responses[len(refused) :]] == [200, 200, 200, 200]
    assert responses[-2].json()["usage"]["completion_tokens"] == 3


def test_a_body_not_declared_json_gets_415(monkeypatch, tokenizer):
    """A web page can POST `text/plain` to a loopback port without a preflight: refused before it is read."""
    loop = ScriptedLoop(tokenizer("x = 1").input_ids)
    monkeypatch.setattr("assisted_backends.api.queue.generate_live", loop)
    state = scripted_state(tokenizer)
    import json

    raw = json.dumps(BODY)
    responses = _ask(state, [
        ("POST", "/v1/completions", {"content": raw, "headers": {"Content-Type": "text/plain"}}),
        ("POST", "/v1/chat/completions", {"content": raw, "headers": {"Content-Type": "multipart/form-data"}}),
        ("POST", "/v1/completions", {"content": raw}),
        ("POST", "/v1/completions", {"content": raw, "headers": {"Content-Type": "application/json; charset=utf-8"}}),
    ])  # fmt: skip
    for response in responses[:3]:
        assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    assert responses[3].status_code == 200
    assert len(loop.calls) == 1  # only the JSON body reached the engine


def test_cors_only_for_the_origins_given(monkeypatch, tokenizer):
    monkeypatch.setattr("assisted_backends.api.queue.generate_live", ScriptedLoop(tokenizer("x = 1").input_ids))
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
    closed = _ask(scripted_state(tokenizer), [
        ("OPTIONS", "/v1/completions", {"headers": preflight}),
        ("POST", "/v1/completions", {"json": BODY, "headers": {"Origin": ORIGIN}}),
    ])  # fmt: skip
    assert all("access-control-allow-origin" not in r.headers for r in closed)
    assert closed[0].status_code in (404, 405)
    opened = _ask(scripted_state(tokenizer, keys=("k",), origins=(ORIGIN,)), [
        ("OPTIONS", "/v1/completions", {"headers": preflight}),
        ("OPTIONS", "/v1/completions", {"headers": {**preflight, "Origin": "https://evil.example"}}),
        ("POST", "/v1/completions", {"json": BODY, "headers": {"Origin": ORIGIN, "Authorization": "Bearer k"}}),
        ("POST", "/v1/completions", {"json": BODY, "headers": {"Origin": ORIGIN}}),
    ])  # fmt: skip
    assert opened[0].status_code == 200 and opened[0].headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in opened[0].headers["access-control-allow-headers"].lower()
    assert opened[1].status_code == 400 and "access-control-allow-origin" not in opened[1].headers
    assert opened[2].status_code == 200 and opened[2].headers["access-control-allow-origin"] == ORIGIN
    assert opened[3].status_code == 401 and opened[3].headers["access-control-allow-origin"] == ORIGIN


def _accepted(server, key: str) -> float:
    """Accepted draft tokens so far, once the engine is idle (a round's statistics follow its tokens)."""
    deadline = time.monotonic() + 30
    while server.get("/health")[1]["busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30).text
    line = next(line for line in text.splitlines() if line.startswith("assisted_accepted_draft_tokens_total"))
    return float(line.split()[1])


def test_one_keys_text_does_not_raise_anothers_acceptance(tmp_path):
    """Suffix decoding drafts from earlier requests: after key A's request, A's repeat of it drafts its whole answer
    from A's index (most of its 48 tokens accepted); key B's same request, and key C's, draft from their own, empty
    indexes (the row's own tokens only): far fewer."""
    keys = tmp_path / "keys.txt"
    keys.write_text("# tenants\nbeta-key\n\ngamma-key\n", encoding="utf-8")
    body = {"model": "demo", "prompt": demo_prompts(3)[2], "max_tokens": 48, "temperature": 0}
    flags = ("--suffix-cache", "--api-key", "alpha-key", "--api-key-file", str(keys), "--slots", "2")
    with running_server(*flags) as server:

        def accepted_for(key: str) -> tuple[float, str]:
            before = _accepted(server, "alpha-key")
            response = httpx.post(f"{server.base_url}/completions", json=body, timeout=120,
                                  headers={"Authorization": f"Bearer {key}"})  # fmt: skip
            assert response.status_code == 200, response.text
            return _accepted(server, "alpha-key") - before, response.json()["choices"][0]["text"]

        first_a, text = accepted_for("alpha-key")
        other_b, text_b = accepted_for("beta-key")
        again_a, text_again = accepted_for("alpha-key")
        fresh_c, _ = accepted_for("gamma-key")
    assert text_b == text == text_again
    assert again_a >= 30 and again_a >= other_b + 15 and again_a >= fresh_c + 15, (first_a, other_b, again_a, fresh_c)

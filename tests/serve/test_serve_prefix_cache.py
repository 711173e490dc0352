"""The server's prefix cache: on by default where reuse is exact (a native-step target), off with
`--no-prefix-cache` or on transformers' modeling, bounded by `--prefix-cache-mb`; /metrics reports the tokens
reused, the hit rate and the bytes held."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model

from assisted_backends.engine.prefix_cache import PrefixCache
from assisted_backends.serve.cli import parse_args
from assisted_backends.serve.server import prefix_cache_of

pytest.importorskip("fastapi")


class NativeStep(torch.nn.Module):
    """Stands for a target on the native decoder step: it makes its own cache."""

    def new_native_cache(self, batch=None, capacity=0):  # pragma: no cover - never called here
        raise AssertionError("not called")


def test_the_flags_turn_it_off_and_bound_it():
    assert parse_args([]).no_prefix_cache is False and parse_args([]).prefix_cache_mb == 512
    args = parse_args(["--no-prefix-cache", "--prefix-cache-mb", "64"])
    assert args.no_prefix_cache is True and args.prefix_cache_mb == 64


def test_on_where_exact_off_elsewhere_and_when_asked():
    cache = prefix_cache_of(parse_args(["--prefix-cache-mb", "64"]), NativeStep())
    assert isinstance(cache, PrefixCache) and cache.max_bytes == 64 << 20
    assert prefix_cache_of(parse_args(["--no-prefix-cache"]), NativeStep()) is False
    assert prefix_cache_of(parse_args([]), tiny_model("llama", seed=0)) is None  # the default: off there


def test_metrics_report_tokens_reused_hit_rate_and_bytes():
    pytest.importorskip("prometheus_client")
    from assisted_backends.serve.metrics import Metrics

    metrics, cache = Metrics(2), PrefixCache(block_tokens=2)
    tokens = [1, 2, 3, 4]
    cache.store(tokens, lambda begin, end: torch.zeros(1, 2, 1, end - begin, 2))
    cache.record(10, 4)
    metrics.prefix_cache(4, cache)
    text = metrics.render()[0].decode()
    assert "assisted_prefix_reused_tokens_total 4.0" in text
    assert "assisted_prefix_hit_rate 0.4" in text
    assert cache.nbytes == 2 * 8 * 4  # two blocks of 8 floats
    assert f"assisted_prefix_cache_bytes {float(cache.nbytes)}" in text


def test_with_keys_each_tenant_reuses_under_its_own_salt_and_metrics_count_it(monkeypatch):
    """Each engine call on a keyed server gets its tenant's scope of the cache (jobs of different keys never share a
    call), and /metrics counts the tokens each call reused."""
    pytest.importorskip("httpx")
    from types import SimpleNamespace

    from scripted_server import ScriptedLoop, demo_tokenizer, scripted_state
    from test_serve_security import BODY, _ask

    tokenizer = demo_tokenizer()
    scripted = ScriptedLoop(tokenizer("x = 1").input_ids)

    def loop(*positional, **arguments):
        return SimpleNamespace(prefix_reused=5, **vars(scripted(*positional, **arguments)))

    monkeypatch.setattr("assisted_backends.api.queue.generate_live", loop)
    state = scripted_state(tokenizer, keys=("alpha-key", "beta-key"), isolated=True)
    cache = PrefixCache()
    state.engine.generator = SimpleNamespace(prefix_cache=cache.scope())
    ask = [("POST", "/v1/completions", {"json": BODY, "headers": {"Authorization": f"Bearer {key}"}})
           for key in ("alpha-key", "beta-key")]  # fmt: skip
    responses = _ask(state, ask)  # the engine stopped afterwards: every call's metrics are in
    assert [r.status_code for r in responses] == [200, 200]
    salts = [call["prefix_cache"].salt for call in scripted.calls]
    assert len(set(salts)) == 2 and all(call["prefix_cache"].cache is cache for call in scripted.calls)
    assert "assisted_prefix_reused_tokens_total 10.0" in state.metrics.render()[0].decode()

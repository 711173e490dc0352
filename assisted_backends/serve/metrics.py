"""The server's Prometheus metrics (`GET /metrics`), in a registry of its own.

Requests by endpoint and status, prompt and generated tokens, output tokens per second over the last
`WINDOW_S` seconds, drafted and accepted tokens with their ratio α, the waiting queue's depth, the slots and
those busy, time to first token and request duration; the prefix cache's tokens reused, hit rate and bytes held.
"""

from __future__ import annotations

import threading
import time
from collections import deque

WINDOW_S = 10.0


class Metrics:
    """Every metric of one server; `prometheus_client` is imported here, when a server starts."""

    def __init__(self, slots: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "assisted_requests", "HTTP requests answered", ["endpoint", "status"], registry=registry
        )
        self.prompt_tokens = Counter("assisted_prompt_tokens", "prompt tokens of admitted requests", registry=registry)
        self.generated_tokens = Counter("assisted_generated_tokens", "tokens generated", registry=registry)
        self.drafted = Counter("assisted_draft_tokens", "draft tokens proposed to the target", registry=registry)
        self.accepted = Counter("assisted_accepted_draft_tokens", "draft tokens the target accepted", registry=registry)
        self.acceptance = Gauge("assisted_acceptance_rate", "accepted / drafted tokens since start", registry=registry)
        self.tokens_per_second = Gauge("assisted_tokens_per_second", f"tokens generated per second over the last "
                                       f"{WINDOW_S:g} s", registry=registry)  # fmt: skip
        self.queue_depth = Gauge("assisted_queue_depth", "requests waiting for a slot", registry=registry)
        self.slots = Gauge("assisted_slots", "batch rows the engine may run", registry=registry)
        self.slots_busy = Gauge("assisted_slots_busy", "batch rows generating now", registry=registry)
        self.ttft = Histogram("assisted_time_to_first_token_seconds", "from admission to the first token",
                              registry=registry)  # fmt: skip
        self.duration = Histogram("assisted_request_duration_seconds", "from admission to the last token",
                                  registry=registry)  # fmt: skip
        self.prefix_reused = Counter("assisted_prefix_reused_tokens", "prompt tokens restored from the prefix cache "
                                     "instead of computed", registry=registry)  # fmt: skip
        self.prefix_hit_rate = Gauge("assisted_prefix_hit_rate", "prefix cache: tokens restored / prompt tokens looked "
                                     "up, since start", registry=registry)  # fmt: skip
        self.prefix_bytes = Gauge("assisted_prefix_cache_bytes", "bytes of keys and values the prefix cache holds",
                                  registry=registry)  # fmt: skip
        self.slots.set(slots)
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, int]] = deque()
        self._drafted = self._accepted = 0

    def tokens(self, count: int) -> None:
        """`count` more tokens generated (any thread)."""
        if count <= 0:
            return
        self.generated_tokens.inc(count)
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, count))
            self._update_rate(now)

    def _update_rate(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent.popleft()
        self.tokens_per_second.set(sum(count for _, count in self._recent) / WINDOW_S)

    def drafting(self, drafted: int, accepted: int) -> None:
        """Totals of one engine call so far: the increments since the last call are counted."""
        with self._lock:
            new_drafted, new_accepted = drafted - self._drafted, accepted - self._accepted
            self._drafted, self._accepted = drafted, accepted
        if new_drafted > 0:
            self.drafted.inc(new_drafted)
        if new_accepted > 0:
            self.accepted.inc(new_accepted)
        total = self.drafted._value.get()
        if total:
            self.acceptance.set(self.accepted._value.get() / total)

    def prefix_cache(self, reused: int, cache) -> None:
        """An engine call restored `reused` prompt tokens from `cache` (an `engine.prefix_cache.PrefixCache`)."""
        if reused > 0:
            self.prefix_reused.inc(reused)
        self.prefix_hit_rate.set(cache.hit_rate)
        self.prefix_bytes.set(cache.nbytes)

    def call_started(self) -> None:
        """An engine call (a run of the batch) starts: its statistics count from zero."""
        with self._lock:
            self._drafted = self._accepted = 0

    def render(self) -> tuple[bytes, str]:
        """(the exposition text, its content type)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        with self._lock:
            self._update_rate(time.monotonic())
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

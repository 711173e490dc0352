"""Load on an OpenAI-compatible chat server for `benchmarks.serve`: streamed greedy requests sent by a closed loop
(N clients, each sending its next prompt when its answer ends) or an open loop (Poisson arrivals at a rate, each
request in its own thread, whatever the server's pace), their figures, and the speculation counters read from the
server's Prometheus `/metrics`.

Figures of a run: requests sent, errors (an answer other than 200 or any exception, counted, never raised),
requests/s and output tokens/s (successful requests and their tokens over the wall time from the first send to the
last answer), time to first token (TTFT), the gaps between streamed chunks, time per output token after the first
(TPOT), p50 and p99 each, and goodput: requests/s that meet both TTFT <= `Slo.ttft_s` and TPOT <= `Slo.tpot_s` (a
one-token answer has no TPOT and meets it; one with no token meets neither).
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import statistics
import threading
import time
from typing import NamedTuple

import httpx

SERVED = "smollm2"  # the model name both servers answer to

# Prometheus counters of draft tokens proposed and accepted: this package's (`assisted_backends.serve.metrics`)
# and llama-server's (`--metrics`)
DRAFTED = ("assisted_draft_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total")
ACCEPTED = ("assisted_accepted_draft_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total")


class Slo(NamedTuple):
    """The service level a request must meet to count in goodput."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1


def one_request(port: int, messages: list[dict], max_tokens: int) -> dict:
    """One streamed greedy chat completion: its text, chunk arrival times, tokens (usage, when the server says),
    total time, and `error` (None, or what went wrong: a status other than 200 or an exception)."""
    body = {"model": SERVED, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    began, answer, error = time.perf_counter(), {"arrivals": [], "parts": [], "usage": None}, None
    try:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=600) as reply:
            if reply.status_code == 200:
                _read_stream(reply, began, answer)
            else:
                error = f"HTTP {reply.status_code}: {reply.read()[:200]!r}"
    except Exception as exception:  # noqa: BLE001  (a load generator counts every failure and goes on)
        error = f"{type(exception).__name__}: {exception}"
    return {"text": "".join(answer["parts"]), "arrivals": answer["arrivals"], "usage": answer["usage"],
            "total_s": time.perf_counter() - began, "error": error}  # fmt: skip


def _read_stream(reply: httpx.Response, began: float, answer: dict) -> None:
    """Server-sent chunks into `answer`: each text part and its arrival (s since `began`), and the usage."""
    for line in reply.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        answer["usage"] = chunk.get("usage") or answer["usage"]
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                answer["arrivals"].append(time.perf_counter() - began)
                answer["parts"].append(text)


def output_tokens(result: dict, tokenizer) -> int:
    """Tokens of an answer: the server's usage, else its text tokenized."""
    usage = result["usage"] or {}
    return usage.get("completion_tokens") or len(tokenizer(result["text"], add_special_tokens=False).input_ids)


def request_times(result: dict, tokens: int) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) of one answer of `tokens` tokens; None where it has no first token, or no second."""
    if not result["arrivals"]:
        return None, None
    first = result["arrivals"][0]
    return first, (result["total_s"] - first) / (tokens - 1) if tokens > 1 else None


def meets(ttft: float | None, tpot: float | None, slo: Slo) -> bool:
    """Whether one request counts in goodput."""
    return ttft is not None and ttft <= slo.ttft_s and (tpot is None or tpot <= slo.tpot_s)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]  # noqa: E731
    return {"p50": round(statistics.median(ordered), 4), "p99": round(pick(0.99), 4), "n": len(ordered)}


def figures(results: list[dict], wall: float, tokenizer, slo: Slo) -> dict:
    """The figures of one run's `results` (see the module's docstring), and each answer's text."""
    done = [r for r in results if r["error"] is None]
    tokens = [output_tokens(r, tokenizer) for r in done]
    times = [request_times(r, n) for r, n in zip(done, tokens)]
    return {
        "requests": len(results),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(done) / wall, 3),
        "output_tokens": sum(tokens),
        "output_tokens_per_s": round(sum(tokens) / wall, 2),
        "ttft_s": percentiles([ttft for ttft, _ in times if ttft is not None]),
        "chunk_gap_s": percentiles([b - a for r in done for a, b in zip(r["arrivals"], r["arrivals"][1:])]),
        "time_per_output_token_s": percentiles([tpot for _, tpot in times if tpot is not None]),
        "errors": len(results) - len(done),
        "first_errors": [r["error"] for r in results if r["error"] is not None][:3],
        "goodput_per_s": round(sum(meets(ttft, tpot, slo) for ttft, tpot in times) / wall, 3),
        "answers": [r["text"] for r in results],
    }


def closed_loop(port: int, prompts: list[list[dict]], max_tokens: int, concurrency: int, tokenizer, slo: Slo) -> dict:
    """Every prompt through `concurrency` clients."""
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda m: one_request(port, m, max_tokens), prompts))
    return {"concurrency": concurrency, **figures(results, time.perf_counter() - began, tokenizer, slo)}


def poisson_arrivals(rate: float, count: int, seed: int = 0) -> list[float]:
    """Send times (s from the start) of `count` requests arriving as a Poisson process of `rate` requests/s: the
    first at 0, then seeded exponential gaps of mean 1 / `rate`."""
    draw = random.Random(seed)
    times = [0.0]
    for _ in range(count - 1):
        times.append(times[-1] + draw.expovariate(rate))
    return times


def open_loop(port: int, prompts: list[list[dict]], max_tokens: int, rate: float, tokenizer, slo: Slo,
              seed: int = 0) -> dict:  # fmt: skip
    """Every prompt once, sent at `poisson_arrivals(rate, ...)`, each in its own thread."""
    results: list[dict] = [{}] * len(prompts)

    def send(index: int) -> None:
        results[index] = one_request(port, prompts[index], max_tokens)

    threads = []
    began = time.perf_counter()
    for index, at in enumerate(poisson_arrivals(rate, len(prompts), seed)):
        time.sleep(max(0.0, began + at - time.perf_counter()))
        threads.append(threading.Thread(target=send, args=(index,), daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join()
    return {"offered_per_s": rate, **figures(results, time.perf_counter() - began, tokenizer, slo)}


def parse_prometheus(text: str) -> dict[str, float]:
    """Samples of a Prometheus exposition text: {"name" or "name{labels}": value}; comments and bad lines skipped."""
    samples = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            samples[name.strip()] = float(value)
        except ValueError:
            continue
    return samples


def read_metrics(port: int) -> dict[str, float] | None:
    """The server's `/metrics` samples, or None when it answers none."""
    try:
        reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    except httpx.HTTPError:
        return None
    return parse_prometheus(reply.text) if reply.status_code == 200 else None


def speculation(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """Draft tokens proposed and accepted between two `/metrics` readings, and their ratio α (None when drafting
    is off); None where the server reports no such counters."""
    if after is None:
        return None
    counted = [(a, b) for a, b in zip(DRAFTED, ACCEPTED) if a in after and b in after]
    if not counted:
        return None
    drafted_name, accepted_name = counted[0]
    since = lambda name: after[name] - (before or {}).get(name, 0.0)  # noqa: E731
    drafted, accepted = since(drafted_name), since(accepted_name)
    return {"drafted": int(drafted), "accepted": int(accepted),
            "acceptance": round(accepted / drafted, 4) if drafted > 0 else None}  # fmt: skip

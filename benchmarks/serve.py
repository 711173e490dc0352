"""`assisted-serve` against llama-server on SmolLM2-135M-Instruct's `.gguf` (Q4_1, from its PyPI wheel), as
clients see them: the same chat prompts (first user turns of held-out ShareGPT conversations, through each
server's chat template), streamed, greedy, at concurrency 1, 4 and 8, each server with speculation off and on.

    python -m benchmarks.serve [--prompts 16] [--max-tokens 64] [--threads 2] [--concurrency 1 4 8] [--set agent]

Speculation on: this package's prompt lookup (`--prompt-lookup 10`, the adaptive schedule) and llama-server's
n-gram drafting (`--spec-type ngram-simple`); off: `--no-assisted` and `--spec-type none`. Both servers get the
same threads and 8 slots. Per configuration: requests/s, output tokens/s (all requests' tokens over the wall
time from the first request to the last answer), time to first token and the gaps between streamed chunks
(p50, p99), time per output token after the first (p50, p99), and whether every greedy answer is the same text
at every concurrency (the servers' batching must not change answers). `--set agent`: an agent's traffic instead
(`agent_prompts`: a ~2,000-token tool catalogue resent with every ask), where each server's prompt cache decides
the time to first token (this package's prefix cache and llama-server's prompt cache, both on by default).
llama-server is built from the llama.cpp that llama-cpp-python vendors (`benchmarks.serve_build`). Writes
benchmarks/results/serve.json.

Read the figures as ratios between servers measured in one run on one machine; the CPU, its flags and the load
average are in the result file.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from benchmarks.harness import command_line, write_result

MODEL = "smollm2-135m-instruct"
SERVED = "smollm2"
START_S = 300
CONTEXT = 4096  # tokens per request (slot) on both servers: an agent's ~2,100-token prompt and its answer fit


def chat_prompts(tokenizer, count: int, max_prompt: int = 256) -> list[list[dict]]:
    """The first user turn of `count` held-out ShareGPT conversations (train-draft's split) of at most
    `max_prompt` tokens."""
    from benchmarks.eagle_chat import held_out_conversations

    chosen = []
    for messages in held_out_conversations(tokenizer, count, max_prompt):
        first = next(m for m in messages if m["role"] == "user")
        chosen.append([{"role": "user", "content": first["content"]}])
    return chosen


def agent_prompts(tokenizer, count: int, catalogue_tokens: int = 2000) -> list[list[dict]]:
    """An agent's traffic: one system message holding a tool catalogue (the Berkeley Function Calling Leaderboard's
    function descriptions, JSON, one a line, up to `catalogue_tokens` tokens: `pip install --no-deps bfcl-eval`)
    and `count` different asks (BFCL's simple questions), every request resending the catalogue."""
    from benchmarks.tool_calls import questions, tools_of

    lines, seen, used = [], set(), 0
    for question in questions("multiple", 200):
        for tool in tools_of(question):
            line = json.dumps(tool["function"], separators=(",", ":"))
            size = len(tokenizer(line, add_special_tokens=False).input_ids)
            if tool["function"]["name"] in seen or used + size > catalogue_tokens:
                continue
            seen.add(tool["function"]["name"])
            lines.append(line)
            used += size
    system = "You are an assistant that may call these functions (JSON, one a line):\n" + "\n".join(lines)
    asks = [question["question"][0][0]["content"] for question in questions("simple_python", count)]
    return [[{"role": "system", "content": system}, {"role": "user", "content": ask}] for ask in asks]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server on a loopback port, started, awaited on `health`, and stopped with SIGTERM."""

    def __init__(self, command: list[str], port: int, health: str, env: dict | None = None) -> None:
        self.port, self.log = port, []
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, **(env or {})})  # fmt: skip
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()
        deadline = time.monotonic() + START_S
        while True:
            with contextlib.suppress(httpx.HTTPError):  # not listening yet
                if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=5).status_code == 200:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{command[0]} did not start:\n" + "".join(self.log[-30:]))
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def ours(gguf: Path, speculate: bool, threads: int, slots: int) -> ServerProcess:
    port = _free_port()
    drafting = ["--prompt-lookup", "10"] if speculate else ["--no-assisted"]
    command = [sys.executable, "-m", "assisted_backends.serve", "-m", str(gguf), "--served-model-name", SERVED,
               "--port", str(port), "--threads", str(threads), "--slots", str(slots), "--max-waiting", "64",
               "--context", str(CONTEXT), *drafting]  # fmt: skip
    return ServerProcess(command, port, "/health", {"HF_HUB_OFFLINE": "1"})


def llama(binary: Path, gguf: Path, speculate: bool, threads: int, slots: int) -> ServerProcess:
    port = _free_port()
    command = [str(binary), "-m", str(gguf), "--alias", SERVED, "--host", "127.0.0.1", "--port", str(port),
               "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(CONTEXT * slots),
               "--spec-type", "ngram-simple" if speculate else "none", "--no-webui"]  # fmt: skip
    return ServerProcess(command, port, "/health")


def one_request(port: int, messages: list[dict], max_tokens: int) -> dict:
    """One streamed greedy chat completion: its text, chunk arrival times, tokens (usage, when the server says)."""
    body = {"model": SERVED, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    began, arrivals, parts, usage = time.perf_counter(), [], [], None
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    arrivals.append(time.perf_counter() - began)
                    parts.append(text)
    return {"text": "".join(parts), "arrivals": arrivals, "usage": usage, "total_s": time.perf_counter() - began}


def run_level(port: int, prompts: list[list[dict]], max_tokens: int, concurrency: int, tokenizer) -> dict:
    """Every prompt through `concurrency` clients: the figures, and each prompt's answer."""
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda m: one_request(port, m, max_tokens), prompts))
    wall = time.perf_counter() - began
    tokens = []
    for result in results:
        usage = result["usage"] or {}
        tokens.append(usage.get("completion_tokens") or len(tokenizer(result["text"], add_special_tokens=False)
                                                             .input_ids))  # fmt: skip
    ttft = [r["arrivals"][0] for r in results if r["arrivals"]]
    gaps = [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    tpot = [(r["total_s"] - r["arrivals"][0]) / (n - 1) for r, n in zip(results, tokens) if r["arrivals"] and n > 1]
    return {
        "concurrency": concurrency,
        "requests": len(prompts),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(prompts) / wall, 3),
        "output_tokens": sum(tokens),
        "output_tokens_per_s": round(sum(tokens) / wall, 2),
        "ttft_s": _percentiles(ttft),
        "chunk_gap_s": _percentiles(gaps),
        "time_per_output_token_s": _percentiles(tpot),
        "answers": [r["text"] for r in results],
    }


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]  # noqa: E731
    return {"p50": round(statistics.median(ordered), 4), "p99": round(pick(0.99), 4), "n": len(ordered)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--servers", nargs="+", default=["assisted", "llama-server"])
    parser.add_argument("--set", choices=("chat", "agent"), default="chat", help="chat: ShareGPT first turns; agent: "
                        "a ~2,000-token tool catalogue resent with each of --prompts different asks")  # fmt: skip
    parser.add_argument("--out", default=None, help="result file (default benchmarks/results/serve.json)")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer  # noqa: F401  (the tokenizer comes from the .gguf)

    from assisted_backends.loading.models import load_tokenizer
    from assisted_backends.loading.real_weights import real_model_gguf
    from benchmarks.serve_build import llama_server

    gguf = real_model_gguf(MODEL)
    tokenizer = load_tokenizer(str(gguf))
    prompts = (agent_prompts if args.set == "agent" else chat_prompts)(tokenizer, args.prompts)
    binary = llama_server() if "llama-server" in args.servers else None
    configurations = []
    for server in args.servers:
        for speculate in (False, True):
            process = ours(gguf, speculate, args.threads, args.slots) if server == "assisted" else llama(
                binary, gguf, speculate, args.threads, args.slots)  # fmt: skip
            try:
                one_request(process.port, prompts[0], 8)  # warm-up (kernels, caches)
                levels = [run_level(process.port, prompts, args.max_tokens, c, tokenizer) for c in args.concurrency]
            finally:
                process.stop()
            answers = [level.pop("answers") for level in levels]
            same = all(a == answers[0] for a in answers[1:])
            changed = [i for i in range(len(prompts)) if len({a[i] for a in answers}) > 1]
            configurations.append({"server": server, "speculation": speculate, "levels": levels,
                                   "answers_identical_across_concurrency": same, "prompts_whose_answer_changed":
                                   changed, "answers_at_concurrency_1": answers[0]})  # fmt: skip
            for level in levels:
                print(
                    f"{server:13s} spec={'on ' if speculate else 'off'} c={level['concurrency']}: "
                    f"{level['requests_per_s']:.2f} req/s, {level['output_tokens_per_s']:.1f} tok/s, "
                    f"TTFT p50 {level['ttft_s'].get('p50')} s, chunk gap p50/p99 "
                    f"{level['chunk_gap_s'].get('p50')}/{level['chunk_gap_s'].get('p99')} s",
                    flush=True,
                )
            print(f"{server:13s} spec={'on ' if speculate else 'off'}: answers identical across concurrency: {same}"
                  f"{'' if same else f' (changed: prompts {changed})'}", flush=True)  # fmt: skip
    native = os.environ.get("ASSISTED_BACKENDS_NATIVE", "unset: on where it covers the model")
    payload = {
        "model": f"{MODEL} ({gguf.name})",
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "slots": args.slots,
        "ASSISTED_BACKENDS_NATIVE": native,
        "prompt_set": "ShareGPT V3 held-out first user turns (<= 256 tokens)" if args.set == "chat" else
        "one ~2,000-token BFCL tool catalogue (system message) + BFCL simple_python asks",
        "configurations": configurations,
    }
    write_result("serve", command_line("serve"), payload, Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

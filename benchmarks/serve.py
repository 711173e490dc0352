"""`assisted-serve` against llama-server on SmolLM2-135M-Instruct's `.gguf` (Q4_1, from its PyPI wheel), as
clients see them: the same chat prompts (`benchmarks.serve_prompts`, through each server's chat template),
streamed, greedy, each server with speculation off and on, in a closed loop at concurrency 1, 4 and 8 and, with
`--poisson`, in an open loop at each given rate (requests/s, Poisson arrivals: `benchmarks.serve_load`).

    python -m benchmarks.serve [--prompts 16] [--max-tokens 64] [--threads 2] [--concurrency 1 4 8]
                               [--set chat|agent|code] [--poisson 0.5 1 2] [--ttft-slo 2] [--tpot-slo 0.1]

Speculation on: this package's prompt lookup (`--prompt-lookup 10`, the adaptive schedule) and llama-server's
n-gram drafting (`--spec-type ngram-simple`); off: `--no-assisted` and `--spec-type none`. Both servers get the
same threads and 8 slots. Per configuration and load: requests/s, output tokens/s (all requests' tokens over the
wall time from the first request to the last answer), time to first token and the gaps between streamed chunks
(p50, p99), time per output token after the first (p50, p99), errors, goodput (requests/s within `--ttft-slo`
and `--tpot-slo`); whether every greedy answer is the same text at every concurrency (the servers' batching must
not change answers); and the draft tokens proposed and accepted over all its loads, read from each server's
`/metrics` (llama-server's with `--metrics`). `--set agent`: an agent's traffic instead (a ~2,000-token tool
catalogue resent with every ask), where each server's prompt cache decides the time to first token (this
package's prefix cache and llama-server's prompt cache, both on by default). `--set code`: HumanEval's problems
asked as completions, explanations and fixes. llama-server is built from the llama.cpp that llama-cpp-python
vendors (`benchmarks.serve_build`). Writes benchmarks/results/serve.json.

Read the figures as ratios between servers measured in one run on one machine; the CPU, its flags and the load
average are in the result file.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from benchmarks.harness import command_line, write_result
from benchmarks.serve_load import SERVED, Slo, closed_loop, one_request, open_loop, read_metrics, speculation
from benchmarks.serve_prompts import agent_prompts, chat_prompts, code_prompts

MODEL = "smollm2-135m-instruct"
START_S = 300
CONTEXT = 4096  # tokens per request (slot) on both servers: an agent's ~2,100-token prompt and its answer fit


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
               "--spec-type", "ngram-simple" if speculate else "none", "--no-webui", "--metrics"]  # fmt: skip
    return ServerProcess(command, port, "/health")


PROMPT_SETS = {
    "chat": (chat_prompts, "ShareGPT V3 held-out first user turns (<= 256 tokens)"),
    "agent": (agent_prompts, "one ~2,000-token BFCL tool catalogue (system message) + BFCL simple_python asks"),
    "code": (code_prompts, "HumanEval problems (seeded sample) asked in turn to complete a function, explain one, "
             "fix one with a planted bug"),
}  # fmt: skip


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--servers", nargs="+", default=["assisted", "llama-server"])
    parser.add_argument("--set", choices=tuple(PROMPT_SETS), default="chat", help="chat: ShareGPT first turns; agent: "
                        "a ~2,000-token tool catalogue resent with each of --prompts different asks; code: HumanEval "
                        "functions to complete, explain or fix")  # fmt: skip
    parser.add_argument("--poisson", type=float, nargs="+", default=[], metavar="RATE", help="also an open loop per "
                        "RATE (requests/s): the same prompts sent at seeded Poisson arrival times")  # fmt: skip
    parser.add_argument("--ttft-slo", type=float, default=Slo().ttft_s, help="goodput: most seconds to first token")
    parser.add_argument("--tpot-slo", type=float, default=Slo().tpot_s, help="goodput: most seconds per later token")
    parser.add_argument("--out", default=None, help="result file (default benchmarks/results/serve.json)")
    args = parser.parse_args(argv)
    if any(rate <= 0 for rate in args.poisson):
        parser.error(f"--poisson {args.poisson}: rates are requests/s above 0, e.g. --poisson 0.5 1 2")
    if args.ttft_slo <= 0 or args.tpot_slo <= 0:
        parser.error("--ttft-slo and --tpot-slo are seconds above 0, e.g. --ttft-slo 2 --tpot-slo 0.1")
    if args.prompts < 1 or any(c < 1 for c in args.concurrency):
        parser.error("--prompts and --concurrency are counts of at least 1, e.g. --prompts 16 --concurrency 1 4 8")
    return args


def measure(process: ServerProcess, prompts: list[list[dict]], args: argparse.Namespace, tokenizer) -> dict:
    """The closed-loop levels, the open-loop rates and the drafting counters of one started server."""
    slo = Slo(args.ttft_slo, args.tpot_slo)
    warm = one_request(process.port, prompts[0], 8)  # warm-up (kernels, caches)
    if warm["error"]:
        raise RuntimeError(f"the warm-up request failed: {warm['error']}")
    before = read_metrics(process.port)
    levels = [closed_loop(process.port, prompts, args.max_tokens, c, tokenizer, slo) for c in args.concurrency]
    rates = [open_loop(process.port, prompts, args.max_tokens, rate, tokenizer, slo) for rate in args.poisson]
    drafting = speculation(before, read_metrics(process.port))
    answers = [level.pop("answers") for level in levels]
    for run in rates:  # {prompt index: answer} where the open loop's answer is not the first level's
        run["answers_differing_from_concurrency_1"] = {
            i: text for i, (text, first) in enumerate(zip(run.pop("answers"), answers[0])) if text != first
        }
    same = all(a == answers[0] for a in answers[1:])
    changed = [i for i in range(len(prompts)) if len({a[i] for a in answers}) > 1]
    return {"levels": levels, "answers_identical_across_concurrency": same, "prompts_whose_answer_changed": changed,
            "answers_at_concurrency_1": answers[0], "poisson": rates, "drafting": drafting}  # fmt: skip


def report(configuration: dict) -> None:
    name = f"{configuration['server']:13s} spec={'on ' if configuration['speculation'] else 'off'}"
    for run in configuration["levels"] + configuration["poisson"]:
        load = f"c={run['concurrency']}" if "concurrency" in run else f"poisson {run['offered_per_s']:g}/s"
        differing = run.get("answers_differing_from_concurrency_1")
        differing = "" if differing is None else f", answers not those at c=1: prompts {sorted(differing)}"
        print(f"{name} {load}: {run['requests_per_s']:.2f} req/s, {run['output_tokens_per_s']:.1f} tok/s, TTFT p50/p99 "
              f"{run['ttft_s'].get('p50')}/{run['ttft_s'].get('p99')} s, TPOT p50/p99 "
              f"{run['time_per_output_token_s'].get('p50')}/{run['time_per_output_token_s'].get('p99')} s, chunk gap "
              f"p50/p99 {run['chunk_gap_s'].get('p50')}/{run['chunk_gap_s'].get('p99')} s, goodput "
              f"{run['goodput_per_s']:.2f} req/s, errors {run['errors']}{differing}", flush=True)  # fmt: skip
    same, changed = configuration["answers_identical_across_concurrency"], configuration["prompts_whose_answer_changed"]
    print(f"{name}: answers identical across concurrency: {same}{'' if same else f' (changed: prompts {changed})'}; "
          f"drafting {configuration['drafting']}", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)

    from transformers import AutoTokenizer  # noqa: F401  (the tokenizer comes from the .gguf)

    from assisted_backends.loading.models import load_tokenizer
    from assisted_backends.loading.real_weights import real_model_gguf
    from benchmarks.serve_build import llama_server

    gguf = real_model_gguf(MODEL)
    tokenizer = load_tokenizer(str(gguf))
    make_prompts, described = PROMPT_SETS[args.set]
    prompts = make_prompts(tokenizer, args.prompts)
    binary = llama_server() if "llama-server" in args.servers else None
    configurations = []
    for server in args.servers:
        for speculate in (False, True):
            process = ours(gguf, speculate, args.threads, args.slots) if server == "assisted" else llama(
                binary, gguf, speculate, args.threads, args.slots)  # fmt: skip
            try:
                configurations.append({"server": server, "speculation": speculate,
                                       **measure(process, prompts, args, tokenizer)})  # fmt: skip
            finally:
                process.stop()
            report(configurations[-1])
    native = os.environ.get("ASSISTED_BACKENDS_NATIVE", "unset: on where it covers the model")
    payload = {
        "model": f"{MODEL} ({gguf.name})",
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "slots": args.slots,
        "ASSISTED_BACKENDS_NATIVE": native,
        "prompt_set": described,
        "poisson_rates": args.poisson,
        "slo": {"ttft_s": args.ttft_slo, "tpot_s": args.tpot_slo},
        "configurations": configurations,
    }
    write_result("serve", command_line("serve"), payload, Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

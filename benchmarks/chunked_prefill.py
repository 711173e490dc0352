"""What a long prompt joining a running batch costs the requests already running, with chunked prefill
(`prefill_chunk=`, `engine.row_pass`) and without: a real `.gguf` model on the native step, through the live queue
the server runs (`api.queue.generate_live`).

    python -m benchmarks.chunked_prefill [--model smollm2-135m-instruct] [--long 2048] [--chunks 0 256 128]
                                         [--threads 2] [--repeats 3] [--output chunked_prefill]

One short request generates (a 32-token prompt, 160 new tokens, plain decoding); after its 10th round a `--long`
token prompt arrives (8 new tokens). Per chunk size (0: the whole prompt in one pass), interleaved repeats, cold
(no prefix cache): the running request's longest wait between two rounds (its stall), its median round, and the
long prompt's time to first token from its arrival. The running request's tokens are checked equal in every case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.harness import command_line, ensure_real_gguf, write_result

RUNNING_PROMPT, RUNNING_NEW, LONG_NEW, ARRIVES_AFTER_ROUNDS = 32, 160, 8, 10


class _Arrivals:
    """The running prompt at once; the long one after `ARRIVES_AFTER_ROUNDS` rounds (counted by `on_round`)."""

    def __init__(self, prompts: list[torch.Tensor]) -> None:
        self.prompts, self.taken, self.rounds, self.arrived_at = prompts, 0, 0, None

    def pending(self) -> int:
        due = 1 if self.rounds < ARRIVES_AFTER_ROUNDS else 2
        if due == 2 and self.arrived_at is None:
            self.arrived_at = time.perf_counter()
        return max(0, due - self.taken)

    def take(self):
        index, self.taken = self.taken, self.taken + 1
        return index, self.prompts[index], RUNNING_NEW if index == 0 else LONG_NEW, []

    def cancelled(self) -> list[int]:
        return []


def _run(generator, prompts: list[torch.Tensor], chunk: int) -> dict:
    """One live call; the running request's round times and tokens, the long prompt's time to first token."""
    from assisted_backends.api.queue import generate_live

    source, progress, finished = _Arrivals(prompts), {0: [], 1: []}, {}

    def on_round(stats) -> None:
        source.rounds += 1

    def on_progress(index: int, tokens: torch.Tensor) -> None:
        progress[index].append((time.perf_counter(), tokens.shape[0]))

    generate_live(generator, source, 4, 4096, lambda i, t: finished.setdefault(i, t.tolist()), on_progress, on_round,
                  do_sample=False, pad_token_id=0, prefix_cache=False, prefill_chunk=chunk)  # fmt: skip
    times = [t for t, _ in progress[0]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    first_long = next(t for t, count in progress[1] if count > 0) if progress[1] else time.perf_counter()
    return {"stall_s": max(gaps), "median_round_ms": 1e3 * statistics.median(gaps),
            "long_ttft_s": first_long - source.arrived_at, "tokens": finished[0]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--long", type=int, default=2048, help="tokens of the prompt that joins")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 256, 128], help="prefill_chunk values")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=None, help="also write benchmarks/results/<OUTPUT>.json")
    arguments = parser.parse_args()

    from assisted_backends.api.generation import AssistedGenerator

    torch.set_num_threads(arguments.threads)
    generator = AssistedGenerator(str(ensure_real_gguf(arguments.model)), prefix_cache=False, threads=arguments.threads)
    ids = (torch.arange(RUNNING_PROMPT + arguments.long) * 7919 % 20000 + 100).long()
    prompts = [ids[:RUNNING_PROMPT], ids[RUNNING_PROMPT:]]
    _run(generator, prompts, 0)  # warm-up: kernels, allocations
    runs: dict[int, list[dict]] = {chunk: [] for chunk in arguments.chunks}
    for _ in range(arguments.repeats):
        for chunk in arguments.chunks:  # interleaved
            runs[chunk].append(_run(generator, prompts, chunk))
    tokens = {tuple(run["tokens"]) for chunk_runs in runs.values() for run in chunk_runs}
    assert len(tokens) == 1, "the running request's tokens changed with the chunk size"
    results = {}
    for chunk, chunk_runs in runs.items():
        entry = {key: statistics.median(run[key] for run in chunk_runs)
                 for key in ("stall_s", "median_round_ms", "long_ttft_s")}  # fmt: skip
        entry["load_average_1min"] = os.getloadavg()[0]
        results[str(chunk)] = entry
        print(f"prefill_chunk {chunk or 'whole':>5}: the running request's longest stall {entry['stall_s']:.3f} s "
              f"(median round {entry['median_round_ms']:.1f} ms); the {arguments.long}-token prompt's first token "
              f"{entry['long_ttft_s']:.2f} s after it arrived (load {entry['load_average_1min']:.1f})")  # fmt: skip
    if arguments.output:
        write_result(arguments.output, command_line("chunked_prefill"), {
            "model": arguments.model, "long_prompt": arguments.long, "threads": arguments.threads,
            "repeats": arguments.repeats, "cases": results})  # fmt: skip


if __name__ == "__main__":
    main()

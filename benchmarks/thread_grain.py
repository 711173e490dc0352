"""When a layer is worth a second thread: one kernel call at 1 and at 2 threads across layer sizes, and whole-model
decoding at 2 threads under the kernels' rule against the rule it replaced.

    python -m benchmarks.thread_grain                          # SmolLM2's and Gemma 3's .gguf, 9 rounds
    python -m benchmarks.thread_grain --files random-0.5B-Q4_0.gguf --rounds 3

1. Calls: Q4_0 layers of 72 KB to 3.4 MB (cold copies, 64 MB of each, so the last-level cache serves nothing), an
   M = 1 call at 1 thread and at 2 threads with the second thread forced (`block_min_bytes_per_thread(1)`): the
   size where two threads start to win is the crossover the rule encodes (block_kernels.cpp,
   kGrainsForASecondThread: a layer takes a second thread from ten 64 KB grains up).
2. Decoding (the native decoder, 32 greedy steps after a 64-token prompt, `benchmarks.native_step`): 1 thread; 2
   threads under the rule; 2 threads under the previous rule (a thread for every 64 KB, so from 128 KB up), which at
   2 threads is the rule with a grain of 12.8 KB (from ten grains = 128 KB, `bytes / grain` >= 2 threads).
   Same bits either way (each output has one owner): the rule only changes speed.
Rounds interleaved, medians. `--files` names random files of `benchmarks.gguf_scaling`'s cache or real models.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.harness import RESULTS, command_line, ensure_real_gguf, write_result
from benchmarks.harness.kernels import require_kernels
from benchmarks.native_step import _decoder
from benchmarks.thread_scaling import _copies, _per_call

SHAPES = ((256, 512), (576, 576), (960, 576), (1024, 1024), (1536, 1024), (3072, 576), (2048, 1536), (4096, 1536))
GRAIN, PREVIOUS_RULE_GRAIN = 65536, 13107
SCALING_CACHE = Path.home() / ".cache" / "assisted_backends" / "scaling"


def _grain(bytes_: int) -> None:
    torch.ops.assisted_backends.block_min_bytes_per_thread(bytes_)


def calls(rounds: int) -> dict[str, dict[str, float]]:
    """Per layer size: microseconds a call at 1 thread and at 2 (second thread forced), and their ratio."""
    layers = {shape: _copies(*shape, 64e6) for shape in SHAPES}
    samples: dict[tuple, list[float]] = {(shape, t): [] for shape in SHAPES for t in (1, 2)}
    for round_index in range(rounds):
        for shape, weights in layers.items():
            for threads in (1, 2) if round_index % 2 == 0 else (2, 1):
                torch.set_num_threads(threads)
                _grain(1)
                samples[(shape, threads)].append(_per_call(weights, 300)[0] * 1e6)
    _grain(GRAIN)
    table = {}
    for shape, weights in layers.items():
        one, two = (statistics.median(samples[(shape, t)]) for t in (1, 2))
        table[f"{shape[0]}x{shape[1]}"] = {"kb": round(weights[0].nbytes / 1000), "us_1t": round(one, 1),
                                           "us_2t": round(two, 1), "1t_over_2t": round(one / two, 3)}  # fmt: skip
    return table


def _path(name: str) -> Path:
    if name.endswith(".gguf"):
        return Path(name) if Path(name).exists() else SCALING_CACHE / name
    return ensure_real_gguf(name)


def decoding(name: str, rounds: int) -> dict[str, float]:
    """Decode tokens/s: 1 thread, 2 under the rule, 2 under the previous rule."""
    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized.model import load_gguf_quantized

    native = NativeCausalLM(load_gguf_quantized(_path(name), tokenizer=False).reference)
    run, _ = _decoder(native, native.new_native_cache, 32)
    cases = {"1t": (1, GRAIN), "2t_rule": (2, GRAIN), "2t_previous_rule": (2, PREVIOUS_RULE_GRAIN)}
    seconds: dict[str, list[float]] = {case: [] for case in cases}
    for round_index in range(rounds + 1):
        for case in cases if round_index % 2 == 0 else reversed(cases):
            threads, grain = cases[case]
            torch.set_num_threads(threads)
            _grain(grain)
            began = time.perf_counter()
            run()
            if round_index:  # the first round warms up
                seconds[case].append(time.perf_counter() - began)
    _grain(GRAIN)
    rates = {f"{case}_tok_s": round(32 / statistics.median(values), 1) for case, values in seconds.items()}
    rates["rule_over_previous_2t"] = round(rates["2t_rule_tok_s"] / rates["2t_previous_rule_tok_s"], 3)
    rates["rule_2t_over_1t"] = round(rates["2t_rule_tok_s"] / rates["1t_tok_s"], 3)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="*", default=["smollm2-135m-instruct", "gemma-3-270m"])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-calls", action="store_true", help="skip part 1")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    status = require_kernels()
    payload: dict = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "kernels": status.line(),
                     "rounds": args.rounds}  # fmt: skip
    if not args.no_calls:
        payload["calls"] = calls(args.rounds)
        print(payload["calls"])
    payload["decoding"] = {}
    for name in args.files:
        payload["decoding"][name] = decoding(name, args.rounds)
        print(name, payload["decoding"][name])
    write_result("thread_grain", command_line("thread_grain"), payload, args.out or RESULTS / "thread_grain.json")


if __name__ == "__main__":
    main()

"""What a second thread can add on the machine at hand: the read bandwidth of one and two threads, the package's
kernel streaming one big layer at each, and the time of one call at the small layer shapes of a 135M model.

    python -m benchmarks.thread_scaling                       # 5 rounds, 1 and 2 threads alternated
    python -m benchmarks.thread_scaling --rounds 1            # smoke
    python -m benchmarks.thread_scaling --threads 1 2 4 8 16  # a bigger machine: each count against one thread

Per round, for 1 then 2 threads: `tensor.sum()` over 0.5 GiB (the read bandwidth), one M = 1 pass over copies of a
65536 x 1024 Q4_0 layer (256 MB in all, so the last-level cache serves nothing), and calls on copies of each small
shape (576 x 576, 960 x 576, 3072 x 576, 576 x 1536: SmolLM2's o, qkv, gate/up, down), with how many threads took
tiles in each call (`block_threads_used`). Medians over rounds; ratios: the kernel's rate over the bandwidth at the
same thread count, and two threads over one for each. Where two threads read little more than one, no kernel can
make a memory-bound step scale: this is the figure that says so.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

import numpy as np
import torch

from benchmarks.block_kernels import random_weight
from benchmarks.harness import RESULTS, command_line, write_result
from benchmarks.harness.kernels import require_kernels
from benchmarks.harness.memory import read_bandwidth_gbs

BIG = (65536, 1024)
SMALL = ((576, 576), (960, 576), (3072, 576), (576, 1536))


def _copies(n: int, k: int, total_bytes: float) -> list:
    first = random_weight("Q4_0", n, k, np.random.default_rng(0))
    count = max(2, int(total_bytes // first.nbytes))
    return [first] + [random_weight("Q4_0", n, k, np.random.default_rng(i)) for i in range(1, count)]


def _per_call(weights: list, calls: int) -> tuple[float, collections.Counter]:
    """Seconds a call (median of the passes over `weights`) and how many threads took tiles in each call."""
    op, used = torch.ops.assisted_backends.block_linear.default, torch.ops.assisted_backends.block_threads_used
    x = torch.randn(1, weights[0].in_features)
    arguments = [w.kernel_arguments() for w in weights]
    for a in arguments[:4]:
        op(x, *a, -1)
    threads: collections.Counter = collections.Counter()
    passes = []
    for _ in range(max(1, calls // len(arguments))):
        began = time.perf_counter()
        for a in arguments:
            op(x, *a, -1)
            threads[int(used())] += 1
        passes.append((time.perf_counter() - began) / len(arguments))
    return statistics.median(passes), threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts, each against 1")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    counts = sorted({1, *args.threads})
    status = require_kernels()
    big = _copies(*BIG, 256e6)
    small = {shape: _copies(*shape, 64e6) for shape in SMALL}
    samples: dict[str, list[float]] = collections.defaultdict(list)
    used: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    loads = []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for threads in counts:
            torch.set_num_threads(threads)
            samples[f"sum_gbs_{threads}t"].append(read_bandwidth_gbs(0.5, 3))
            seconds, _ = _per_call(big, len(big))
            samples[f"kernel_gbs_{threads}t"].append(sum(w.nbytes for w in big) / len(big) / seconds / 1e9)
            for (n, k), weights in small.items():
                seconds, threads_used = _per_call(weights, 300)
                samples[f"call_us_{n}x{k}_{threads}t"].append(seconds * 1e6)
                used[f"{n}x{k}_{threads}t"].update(threads_used)
    medians = {name: round(statistics.median(values), 2) for name, values in samples.items()}
    ratios = {}
    for t in counts:
        ratios[f"kernel_over_bandwidth_{t}t"] = medians[f"kernel_gbs_{t}t"] / medians[f"sum_gbs_{t}t"]
        if t > 1:
            ratios[f"bandwidth_{t}t_over_1t"] = medians[f"sum_gbs_{t}t"] / medians["sum_gbs_1t"]
            ratios[f"kernel_{t}t_over_1t"] = medians[f"kernel_gbs_{t}t"] / medians["kernel_gbs_1t"]
            for n, k in SMALL:
                ratios[f"call_{n}x{k}_1t_over_{t}t"] = medians[f"call_us_{n}x{k}_1t"] / medians[f"call_us_{n}x{k}_{t}t"]
    ratios = {name: round(value, 3) for name, value in ratios.items()}
    print(medians, ratios, sep="\n")
    payload = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "kernels": status.line(), "rounds": args.rounds,
               "load_average_1m": loads, "medians": medians, "ratios": ratios,
               "threads_that_took_tiles": {name: dict(counter) for name, counter in used.items()}}  # fmt: skip
    write_result("thread_scaling", command_line("thread_scaling"), payload, args.out or RESULTS / "thread_scaling.json")


if __name__ == "__main__":
    main()

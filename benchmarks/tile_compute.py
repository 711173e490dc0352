"""How fast the tiles compute when memory is not in the way, against how fast they stream when it is: the floor the
arithmetic puts under a verify pass of 8 rows, measured on the machine at hand.

    python -m benchmarks.tile_compute                       # Q4_0 Q4_K Q5_K Q6_K Q8_0, 1 thread, 7 repeats
    python -m benchmarks.tile_compute --formats Q4_0 --repeats 3    # smoke

Per format: one 2048 x 768 layer (about 1 MB: it stays in L2 / L3) called again and again at M = 1 and M = 8
("hot"), and M = 1 over copies of it filling 256 MB, so every call streams from memory ("cold"); medians, 1 thread.
Hot M = 8 over cold M = 1 is the least an 8-row verify pass can cost in one-row steps of these kernels: the dot
products alone, with the weights already in cache. Hot M = 1 over cold M = 1 says how much faster the tile
computes than memory feeds it (below ~2, part of the arithmetic shows in the streamed rate).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from benchmarks.block_kernels import random_weight
from benchmarks.harness import RESULTS, command_line, write_result
from benchmarks.harness.kernels import require_kernels

SHAPE = (2048, 768)
COLD_BYTES = 256e6


def _seconds(call, repeats: int, inner: int) -> float:
    call()
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(inner):
            call()
        samples.append((time.perf_counter() - began) / inner)
    return statistics.median(samples)


def measure(kind: str, repeats: int) -> dict[str, float]:
    weights = [random_weight(kind, *SHAPE, np.random.default_rng(0))]
    copies = int(COLD_BYTES // weights[0].nbytes)
    weights += [random_weight(kind, *SHAPE, np.random.default_rng(i)) for i in range(1, copies)]
    op = torch.ops.assisted_backends.block_linear.default
    arguments = [w.kernel_arguments() for w in weights]
    x = torch.randn(8, SHAPE[1])
    tiny, one_block = random_weight("Q4_0", 16, 32, np.random.default_rng(0)).kernel_arguments(), torch.randn(1, 32)
    fixed = _seconds(lambda: op(one_block, *tiny, -1), repeats, 400)  # a call's own cost, from Python
    row = x[:1].clone()
    hot_1 = _seconds(lambda: op(row, *arguments[0], -1), repeats, 200) - fixed
    hot_8 = _seconds(lambda: op(x, *arguments[0], -1), repeats, 100) - fixed

    def cold() -> None:
        for a in arguments:
            op(row, *a, -1)

    cold_1 = _seconds(cold, repeats, 1) / len(arguments) - fixed
    weights_count = SHAPE[0] * SHAPE[1]
    return {"bytes": weights[0].nbytes, "call_us": round(fixed * 1e6, 2),
            "hot_m1_gweights_s": round(weights_count / hot_1 / 1e9, 1),
            "cold_m1_gweights_s": round(weights_count / cold_1 / 1e9, 1),
            "cold_m1_gbs": round(weights[0].nbytes / cold_1 / 1e9, 1),
            "hot_m1_over_cold_m1_speed": round(cold_1 / hot_1, 2),
            "hot_m8_in_cold_m1_steps": round(hot_8 / cold_1, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="*", default=["Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    status = require_kernels()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    results = {}
    for kind in args.formats:
        results[kind] = measure(kind, args.repeats)
        print(kind, results[kind], flush=True)
    payload = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "kernels": status.line(),
        "shape": list(SHAPE),
        "load_average_1m": [load, os.getloadavg()[0]],
        "results": results,
    }
    write_result("tile_compute", command_line("tile_compute"), payload, args.out or RESULTS / "tile_compute.json")


if __name__ == "__main__":
    main()

"""Q5_0, Q5_1, Q5_K in 5 bits and Q6_K in 6 (nibbles and a plane of high bits) against the 8-bit widened layout
they had before, on one big layer, interleaved: the same outputs bit for bit (checked here too), fewer bytes
streamed a step.

    python -m benchmarks.bit_planes                                  # Q5_0, 65536 x 1536, M = 1 and 8, 1-2 threads
    python -m benchmarks.bit_planes --format Q6_K --shape 65536 1536
    python -m benchmarks.bit_planes --shape 4096 1024 --repeats 3    # smoke

Per thread count: the median time of each layout and M, its effective GB/s (bytes stored / time), and the ratio
widened / planes (above 1: the layout with planes is faster). Weights are random blocks of the format with sane
fp16 scales (speed does not depend on the values). The 1-minute load average before and after and the CPU's flags
are recorded.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from assisted_backends.quantized import blocks
from benchmarks.block_kernels import random_weight
from benchmarks.harness import RESULTS, command_line, interleaved, write_result
from benchmarks.harness.kernels import require_kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=("Q5_0", "Q5_1", "Q5_K", "Q6_K"), default="Q5_0")
    parser.add_argument("--shape", nargs=2, type=int, default=[65536, 1536], metavar=("N", "K"))
    parser.add_argument("--rows", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    status = require_kernels()
    n, k = args.shape
    new = random_weight(args.format, n, k, np.random.default_rng(0))
    old = blocks.widened(new)
    x = torch.randn(max(args.rows), k, generator=torch.Generator().manual_seed(0))
    for rows in args.rows:
        if not torch.equal(new.matmul(x[:rows]), old.matmul(x[:rows])):
            raise SystemExit(f"the layouts differ at M = {rows}: a bug, not a speed")
    layouts = {"planes": new, "widened": old}
    cases = {f"{name}_{rows}": (lambda w=w, rows=rows: w.matmul(x[:rows])) for name, w in layouts.items()
             for rows in args.rows}  # fmt: skip
    results = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        before = os.getloadavg()[0]
        medians = interleaved(cases, args.repeats, warmup=2).medians()
        row = {"threads": threads, "load_before": before, "load_after": os.getloadavg()[0]}
        for rows in args.rows:
            for name, w in layouts.items():
                seconds = medians[f"{name}_{rows}"]
                row[f"{name}_m{rows}"] = {"ms": round(1e3 * seconds, 3), "gbs": round(w.nbytes / seconds / 1e9, 1)}
            row[f"widened_over_planes_m{rows}"] = round(medians[f"widened_{rows}"] / medians[f"planes_{rows}"], 3)
        print(row, flush=True)
        results.append(row)
    payload = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "kernels": status.line(), "format": args.format,
               "shape": [n, k],
               "bytes": {name: w.nbytes for name, w in layouts.items()}, "results": results}  # fmt: skip
    default = RESULTS / f"{args.format.lower()}_planes.json"
    write_result("bit_planes", command_line("bit_planes"), payload, args.out or default)


if __name__ == "__main__":
    main()

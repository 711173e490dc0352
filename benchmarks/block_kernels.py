"""The package's block kernels alone, at the linear-layer shapes of 0.5B / 1.5B / 3B / 7B models, against the read
bandwidth measured in the same run and against PyTorch's int4 kernel (the fallback).

    python -m benchmarks.block_kernels                                  # 0.5B 1.5B 7B, Q4_0 Q4_K Q8_0, 1 and 2 threads
    python -m benchmarks.block_kernels --sizes 0.5B --formats Q4_0 --threads 1 --repeats 3   # smoke

Per size, format and thread count: one pass over every linear layer of the model's decoder (the layers' own
copies, so nothing is served from a cache; the LM head left out) with M = 1, 2, 4, 5, 8, 16 activation rows,
interleaved; the median time of M = 1 as effective GB/s (weight bytes / time) and as a fraction of `tensor.sum()`'s
read bandwidth; the other M as multiples of M = 1 (a verify pass of γ = M − 1 costs that many decode steps of
the layers). PyTorch's `_weight_int4pack_mm_for_cpu` (group 32, bf16) runs the same shapes for comparison.
Weights are random bytes with sane fp16 scales: speed does not depend on the values.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from assisted_backends.native import extension
from assisted_backends.quantized import blocks, kernels
from benchmarks.gguf_scaling import SHAPES
from benchmarks.harness import RESULTS, command_line, interleaved, write_result
from benchmarks.harness.memory import read_bandwidth_gbs

ROWS = (1, 2, 4, 5, 8, 16)
_BLOCK = {"Q4_0": (32, 18, (0,)), "Q8_0": (32, 34, (0,)), "Q4_K": (256, 144, (0, 2)), "Q6_K": (256, 210, (208,))}


def layer_shapes(size: str) -> list[tuple[int, int]]:
    """[N, K] of one decoder layer's linear weights: q, k, v, o, gate, up, down."""
    s = SHAPES[size]
    head = s.hidden // s.heads
    kv = s.kv_heads * head
    return [(s.hidden, s.hidden), (kv, s.hidden), (kv, s.hidden), (s.hidden, s.hidden),
            (s.intermediate, s.hidden), (s.intermediate, s.hidden), (s.hidden, s.intermediate)]  # fmt: skip


def random_weight(kind: str, n: int, k: int, rng: np.random.Generator) -> blocks.BlockWeight:
    block, size, halves = _BLOCK[kind]
    raw = rng.integers(0, 256, (n * k // block, size), dtype=np.uint8)
    for start in halves:
        scales = (rng.random(len(raw)) * 1e-3 + 1e-4).astype(np.float16)
        raw[:, start : start + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.from_gguf(kind, raw, (n, k))


def aten_weight(n: int, k: int, rng: np.random.Generator):
    codes = torch.from_numpy(rng.integers(0, 16, (n, k), dtype=np.int32))
    scales = torch.full((n, k // 32), 1e-3)
    return kernels.pack_int4_codes(codes), kernels.scale_zeros_tensor(scales, torch.zeros_like(scales), torch.bfloat16)


def cases_for(size: str, kind: str, with_aten: bool) -> tuple[dict, dict[str, int]]:
    """{case name: callable} for every M, and the bytes each variant reads per pass."""
    rng = np.random.default_rng(0)
    layers = SHAPES[size].layers
    shapes = [shape for shape in layer_shapes(size) if shape[1] % (256 if kind.endswith("_K") else 32) == 0]
    one_layer = [random_weight(kind, n, k, rng) for n, k in shapes]
    weights = [one_layer] + [[_copy(w) for w in one_layer] for _ in range(layers - 1)]
    inputs = {k: torch.randn(max(ROWS), k) for _, k in shapes}
    cases = {}
    for rows in ROWS:
        cases[f"blocks_{rows}"] = lambda rows=rows: [
            w.matmul(inputs[w.in_features][:rows]) for layer in weights for w in layer
        ]
    sizes = {"blocks": sum(w.nbytes for layer in weights for w in layer)}
    if with_aten:
        packed = [aten_weight(n, k, rng) for n, k in shapes]
        aten = [packed] + [[(p.clone(), sz.clone()) for p, sz in packed] for _ in range(layers - 1)]
        bf16 = {k: x.bfloat16() for k, x in inputs.items()}
        widths = [k for _, k in shapes]
        for rows in ROWS:
            cases[f"aten_{rows}"] = lambda rows=rows: [
                kernels.int4_mm(bf16[k][:rows], p, 32, sz) for layer in aten for (p, sz), k in zip(layer, widths)
            ]
        sizes["aten"] = sum(p.nbytes + sz.nbytes for layer in aten for p, sz in layer)
    return cases, sizes


def _copy(weight: blocks.BlockWeight) -> blocks.BlockWeight:
    tensors = {name: tensor.clone() for name, tensor in weight.tensors().items()}
    return blocks.BlockWeight.from_stored(tensors, weight.meta())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="*", default=["0.5B", "1.5B", "7B"], choices=list(SHAPES))
    parser.add_argument("--formats", nargs="*", default=["Q4_0", "Q4_K", "Q8_0"], choices=list(_BLOCK))
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-aten", action="store_true", help="leave PyTorch's int4 kernel out")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    status = extension.status()
    if not status.available:
        raise SystemExit(f"the package's kernels do not run here: {status.reason}")
    results = []
    for size in args.sizes:
        for kind in args.formats:
            cases, sizes = cases_for(size, kind, with_aten=not args.no_aten and kind == "Q4_0")
            for threads in args.threads:
                torch.set_num_threads(threads)
                bandwidth = read_bandwidth_gbs()
                timings = interleaved(cases, args.repeats, warmup=1)
                medians = timings.medians()
                row = {"size": size, "format": kind, "threads": threads, "read_bandwidth_gbs": round(bandwidth, 1)}
                for variant, nbytes in sizes.items():
                    one = medians[f"{variant}_1"]
                    spread = [round(1e3 * t, 2) for t in (min(timings.seconds[f"{variant}_1"]),
                                                          max(timings.seconds[f"{variant}_1"]))]  # fmt: skip
                    row[variant] = {
                        "weight_mb": round(nbytes / 1e6, 1),
                        "m1_ms": round(1e3 * one, 2),
                        "m1_spread_ms": spread,
                        "m1_gbs": round(nbytes / one / 1e9, 1),
                        "m1_of_bandwidth": round(nbytes / one / 1e9 / bandwidth, 2),
                        "m_in_steps": {m: round(medians[f"{variant}_{m}"] / one, 2) for m in ROWS if m > 1},
                    }
                print(row, flush=True)
                results.append(row)
            del cases
    loads = [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    payload = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "kernels": status.line(), "load_average": loads,
               "results": results}  # fmt: skip
    write_result("block_kernels", command_line("block_kernels"), payload, args.out or RESULTS / "block_kernels.json")


if __name__ == "__main__":
    main()

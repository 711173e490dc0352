"""The package's block kernels alone, at the linear-layer shapes of 0.5B / 1.5B / 3B / 7B models, against the read
bandwidth measured in the same run and against PyTorch's int4 kernel (the fallback).

    python -m benchmarks.block_kernels                                  # 0.5B 1.5B 7B, Q4_0 Q4_K Q8_0, 1 and 2 threads
    python -m benchmarks.block_kernels --sizes 0.5B --formats Q4_0 --threads 1 --repeats 3   # smoke
    python -m benchmarks.block_kernels --prefetch 0 2048 6144 12288 --sizes 1.5B --formats Q4_0 --no-aten
    python -m benchmarks.block_kernels --paths avx512vnni amx --sizes 1.5B --no-aten   # paths side by side
    python -m benchmarks.block_kernels --decode --sizes 0.5B 1.5B 3B 7B          # against llama-bench, whole models

Per size, format and thread count: one pass over every linear layer of the model's decoder (the layers' own
copies, so nothing is served from a cache; the LM head left out) with M = 1, 2, 4, 5, 8, 16 activation rows,
interleaved; the median time of M = 1 as effective GB/s (weight bytes / time) and as a fraction of `tensor.sum()`'s
read bandwidth; the other M as multiples of M = 1 (a verify pass of γ = M − 1 costs that many decode steps of
the layers). PyTorch's `_weight_int4pack_mm_for_cpu` (group 32, bf16) runs the same shapes for comparison.
Weights are random bytes with sane fp16 scales: speed does not depend on the values. `--prefetch` repeats the
M = 1 pass at each prefetch distance (bytes ahead in the code stream, `block_prefetch`), interleaved: the
distance to keep on this machine. The CPU's model name and instruction-set flags are recorded with the figures.
`--paths` times the named kernel paths side by side (interleaved) instead of the CPU's default one; with `amx` among
them, AMX tiles take every pass (`block_amx_min_rows` 1), so each M shows what AMX gives there.

`--cpu-clock` (one thread only) times every case by the calling thread's CPU time (`time.thread_time`), the read
bandwidth too: on a machine shared with other work, the time the scheduler gave the thread to someone else is
left out, so the fractions stay readable where wall-clock ones do not (memory traffic of the neighbours still
counts).

`--decode`: whole models instead of layers. For each size and `--quants` (Q4_0, or the Q4_K_M- and Q5_K_M-like
mixes), the random file of `benchmarks.gguf_scaling` (written on first use), and each real model of `--models`,
decoded greedily by this package (`--new-tokens` tokens after a one-token prompt, EOS ignored; a 128-token prompt's
prefill) and by llama.cpp's `llama-bench` (tg`--new-tokens` from an empty context and pp128, one repetition a run;
built by `benchmarks.harness.llama_cpp_tools`), alternated `--repeats` times per thread count; medians, the ratios, this
package's 5- and 8-row verify passes in one-token steps, its load time, and two threads over one for each engine.

    python -m benchmarks.block_kernels --decode --sizes 0.5B 1.5B 3B 7B --quants Q4_0 Q4_K_M \
        --models smollm2-135m-instruct gemma-3-270m --threads 1 2 --repeats 3
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from assisted_backends.native import extension
from assisted_backends.quantized import blocks, kernels
from benchmarks.gguf_scaling import QUANTS, SHAPES
from benchmarks.harness import RESULTS, command_line, interleaved, write_result
from benchmarks.harness.kernels import require_kernels
from benchmarks.harness.memory import read_bandwidth_gbs

ROWS = (1, 2, 4, 5, 8, 16)
PREFILL = 128  # --decode: prompt tokens of the prefill comparison (llama-bench pp128)
_BLOCK = {"Q4_0": (32, 18, (0,)), "Q5_0": (32, 22, (0,)), "Q5_1": (32, 24, (0, 2)), "Q8_0": (32, 34, (0,)),
          "Q4_K": (256, 144, (0, 2)), "Q5_K": (256, 176, (0, 2)), "Q6_K": (256, 210, (208,))}  # fmt: skip


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


def cases_for(size: str, kind: str, with_aten: bool, paths: tuple[str, ...] = ()) -> tuple[dict, dict[str, int]]:
    """{case name: callable} for every M, and the bytes each variant reads per pass: "blocks" (the default path), or
    each of `paths` (extension.ISA_NAMES) forced."""
    rng = np.random.default_rng(0)
    layers = SHAPES[size].layers
    shapes = [shape for shape in layer_shapes(size) if shape[1] % (256 if kind.endswith("_K") else 32) == 0]
    one_layer = [random_weight(kind, n, k, rng) for n, k in shapes]
    weights = [one_layer] + [[_copy(w) for w in one_layer] for _ in range(layers - 1)]
    inputs = {k: torch.randn(max(ROWS), k) for _, k in shapes}
    cases, sizes = {}, {}
    for name, isa in [(path, extension.ISA_NAMES.index(path)) for path in paths] or [("blocks", None)]:
        for rows in ROWS:
            cases[f"{name}_{rows}"] = lambda rows=rows, isa=isa: [
                w.matmul(inputs[w.in_features][:rows], isa) for layer in weights for w in layer
            ]
        sizes[name] = sum(w.nbytes for layer in weights for w in layer)
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
    parser.add_argument("--prefetch", nargs="*", type=int, default=[], help="prefetch distances (bytes) to compare")
    parser.add_argument("--cpu-clock", action="store_true", help="time by the thread's CPU time (1 thread only)")
    parser.add_argument("--decode", action="store_true", help="whole models against llama-bench (module docstring)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--quants", nargs="*", default=["Q4_0"], choices=QUANTS, help="--decode: random files")
    parser.add_argument("--models", nargs="*", default=[], help="--decode: real models too (smollm2-135m-instruct ...)")
    parser.add_argument("--paths", nargs="*", default=[], choices=extension.ISA_NAMES, help="kernel paths side by side")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    status = require_kernels()
    missing = [path for path in args.paths if path not in extension.runnable_isas()]
    if missing:
        runs = ", ".join(extension.runnable_isas())
        raise SystemExit(f"--paths: this CPU does not run {', '.join(missing)} (it runs {runs})")
    if "amx" in args.paths:
        torch.ops.assisted_backends.block_amx_min_rows(1)
    if args.decode:
        return decode_main(args, status)
    if args.prefetch:
        return prefetch_main(args, status)
    results = []
    for size in args.sizes:
        for kind in args.formats:
            cases, sizes = cases_for(size, kind, not args.no_aten and kind == "Q4_0", tuple(args.paths))
            for threads in args.threads:
                torch.set_num_threads(threads)
                if args.cpu_clock:
                    if threads != 1:
                        raise SystemExit("--cpu-clock times one thread: pass --threads 1")
                    bandwidth = _cpu_read_bandwidth_gbs()
                    timings = _cpu_timed(cases, args.repeats)
                else:
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
                        "m_ms": {m: round(1e3 * medians[f"{variant}_{m}"], 2) for m in ROWS},
                    }
                print(row, flush=True)
                results.append(row)
            del cases
    loads = [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    payload = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "kernels": status.line(), "cpu": _cpu(),
               "clock": "thread CPU time" if args.cpu_clock else "wall",
               "load_average": loads, "results": results}  # fmt: skip
    write_result("block_kernels", command_line("block_kernels"), payload, args.out or RESULTS / "block_kernels.json")


def _cpu_timed(cases: dict, repeats: int):
    """`interleaved`'s rounds, each call timed by the calling thread's CPU seconds."""
    from benchmarks.harness.timing import Timings

    timings = Timings({name: [] for name in cases}, {name: [] for name in cases})
    for case in cases.values():  # warm-up
        case()
    for _ in range(repeats):
        for name, case in cases.items():
            began = time.thread_time()
            case()
            timings.seconds[name].append(time.thread_time() - began)
    return timings


def _cpu_read_bandwidth_gbs(gib: float = 1.0, repeats: int = 3) -> float:
    data = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    data.sum()
    best = float("inf")
    for _ in range(repeats):
        began = time.thread_time()
        data.sum()
        best = min(best, time.thread_time() - began)
    return data.numel() * 4 / best / 1e9


def _cpu() -> dict:
    from benchmarks.harness.llama_cpp_tools import cpu_model_and_flags

    model, flags = cpu_model_and_flags()
    return {"model": model, "isa_flags": [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))]}


def _loads() -> list[float]:
    return [float(x) for x in open("/proc/loadavg").read().split()[:3]]


def prefetch_main(args, status) -> None:
    """M = 1 passes at each prefetch distance, interleaved (per size, format, thread count)."""
    previous = int(torch.ops.assisted_backends.block_prefetch(-1))
    results = []
    for size in args.sizes:
        for kind in args.formats:
            cases, sizes = cases_for(size, kind, with_aten=False)
            one = cases["blocks_1"]

            def at(distance: int, one=one):
                return lambda: (torch.ops.assisted_backends.block_prefetch(distance), one())

            variants = {f"prefetch_{d}": at(d) for d in args.prefetch}
            for threads in args.threads:
                torch.set_num_threads(threads)
                timed = args.cpu_clock and threads == 1
                timings = _cpu_timed(variants, args.repeats) if timed else interleaved(variants, args.repeats, warmup=1)
                medians = timings.medians()
                best = min(medians, key=medians.get)
                row = {"size": size, "format": kind, "threads": threads, "load_before": _loads(),
                       "clock": "thread CPU time" if timed else "wall",
                       "m1_gbs": {name: round(sizes["blocks"] / t / 1e9, 1) for name, t in medians.items()},
                       "best": best}  # fmt: skip
                print(row, flush=True)
                results.append(row)
            del cases
    torch.ops.assisted_backends.block_prefetch(previous)
    payload = {"what": "M = 1 layer passes at several prefetch distances", "kernels": status.line(), "cpu": _cpu(),
               "load_average": _loads(), "results": results}  # fmt: skip
    write_result(
        "block_kernels", command_line("block_kernels"), payload, args.out or RESULTS / "block_kernels_prefetch.json"
    )


def decode_files(args) -> list[tuple[str, str, object]]:
    """(label, quantization, path) of every file `--decode` measures: the random files of `--sizes` x `--quants`,
    then the real models of `--models`."""
    from benchmarks.gguf_scaling import random_file
    from benchmarks.harness import ensure_real_gguf

    files = [(size, quant, random_file(size, quant)) for size in args.sizes for quant in args.quants]
    return files + [(name, "file", ensure_real_gguf(name)) for name in args.models]


def decode_main(args, status) -> None:
    """Whole models, plain greedy decoding and a 128-token prefill: this package against llama-bench, alternated."""
    import statistics

    import assisted_backends
    from benchmarks.gguf_scaling import ours, ours_decoder
    from benchmarks.harness.llama_cpp_tools import llama_cpp_tools, run_bench
    from benchmarks.harness.steps import step_seconds

    tools = llama_cpp_tools()
    prompt = torch.arange(10, 26)[None]
    long_prompt = torch.arange(300, 300 + PREFILL)[None]
    results = []
    for label, quant, path in decode_files(args):
        model, load_s = ours(path)
        for threads in args.threads:
            assisted_backends.set_threads(threads)
            decode = ours_decoder(model, prompt[:, :1], args.new_tokens)  # one prompt token: tg's empty context
            prefill = ours_decoder(model, long_prompt, 1)
            decode(), prefill()  # warm-up
            ours_tps, peer_tps, ours_pp, peer_pp = [], [], [], []
            load_before = _loads()
            for _ in range(args.repeats):
                began = time.perf_counter()
                decode()
                ours_tps.append(args.new_tokens / (time.perf_counter() - began))
                began = time.perf_counter()
                prefill()
                ours_pp.append(PREFILL / (time.perf_counter() - began))
                bench = run_bench(path, threads=(threads,), prompts=(PREFILL,), gen=args.new_tokens, repetitions=1,
                                  tools=tools)  # fmt: skip
                peer_tps.append(bench["by_threads"][threads]["decode_tok_s"])
                peer_pp.append(bench["by_threads"][threads]["prefill_tok_s"][PREFILL])
            step = step_seconds(model, prompt, 1, repeats=5)
            row = {
                "model": label, "quant": quant, "threads": threads, "new_tokens": args.new_tokens,
                "ours_tok_s": round(statistics.median(ours_tps), 2),
                "ours_spread": [round(min(ours_tps), 2), round(max(ours_tps), 2)],
                "llama_bench_tok_s": round(statistics.median(peer_tps), 2),
                "llama_bench_spread": [round(min(peer_tps), 2), round(max(peer_tps), 2)],
                "ours_prefill_tok_s": round(statistics.median(ours_pp), 1),
                "llama_bench_prefill_tok_s": round(statistics.median(peer_pp), 1),
                "ours_step_ms": round(1e3 * step, 1),
                "ours_verify_5_in_steps": round(step_seconds(model, prompt, 5, repeats=5) / step, 2),
                "ours_verify_8_in_steps": round(step_seconds(model, prompt, 8, repeats=5) / step, 2),
                "ours_load_s": round(load_s, 2), "file_mb": round(path.stat().st_size / 1e6, 1),
                "load_before": load_before, "load_after": _loads(),
            }  # fmt: skip
            row["ours_vs_llama_bench"] = round(row["ours_tok_s"] / row["llama_bench_tok_s"], 3)
            row["prefill_vs_llama_bench"] = round(row["ours_prefill_tok_s"] / row["llama_bench_prefill_tok_s"], 3)
            print(row, flush=True)
            results.append(row)
        for one, two in zip(results[-len(args.threads) :], results[-len(args.threads) + 1 :]):
            two["ours_two_over_one"] = round(two["ours_tok_s"] / one["ours_tok_s"], 2)
            two["llama_bench_two_over_one"] = round(two["llama_bench_tok_s"] / one["llama_bench_tok_s"], 2)
        del model
    payload = {"what": "plain greedy decoding and a 128-token prefill: this package against llama-bench (tg, pp)",
               "kernels": status.line(), "cpu": _cpu(), "llama_cpp_tools": str(tools["llama-bench"]),
               "load_average": _loads(), "results": results}  # fmt: skip
    write_result(
        "block_kernels", command_line("block_kernels"), payload, args.out or RESULTS / "block_kernels_decode.json"
    )


if __name__ == "__main__":
    main()

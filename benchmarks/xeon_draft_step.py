"""Draft decode step on the CPU: w8af32 (both compute paths) and bf16, each against fp32.

One decode step = one token through the draft on top of a 128-position KV cache, exactly what the
drafter does γ times per round. Also the kernel table (one 4096 x 4096 linear at M = 1, 4, 8 tokens)
that ../shared/notes/ENVIRONMENT.md quotes, re-measured. Cases run interleaved; medians; ratios
against fp32 (below 1 is faster).

    python -m benchmarks.xeon_draft_step                # ~3 minutes on 2 cores
    python -m benchmarks.xeon_draft_step --threads 1 --repeats 15
"""

from __future__ import annotations

import argparse
import copy
import warnings

import torch

from assisted_backends.backends.cpu.quantize import METHODS, quantize_w8af32
from benchmarks.harness import command_line, forward_step, interleaved, median_ms, random_llama, write_result

DRAFT_SHAPES = {  # name: (hidden, layers, vocab)
    "small (h256 x 2, V 4096)": (256, 2, 4096),
    "medium (h512 x 2, V 32000)": (512, 2, 32000),
    "large (h1024 x 4, V 32000)": (1024, 4, 32000),
}


def _variants(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    variants = {"fp32": model, "bf16": copy.deepcopy(model).to(torch.bfloat16)}
    for method in METHODS:
        variants[f"w8af32[{method}]"] = quantize_w8af32(model, method)
    return variants


def _decode_step(model: torch.nn.Module, context: int = 128):
    """One token through `model` on a cache of `context` random tokens."""
    return forward_step(model, torch.randint(0, model.config.vocab_size, (1, context)))


def draft_steps(repeats: int) -> dict:
    results = {}
    for label, (hidden, layers, vocab) in DRAFT_SHAPES.items():
        model = random_llama(hidden, layers, vocab, seed=0)
        cases = {name: _decode_step(variant) for name, variant in _variants(model).items()}
        medians = {name: median_ms(values) for name, values in interleaved(cases, repeats).seconds.items()}
        ratios = {name: round(value / medians["fp32"], 3) for name, value in medians.items()}
        results[label] = {"median_ms": medians, "ratio_vs_fp32": ratios}
        print(label, {name: f"{medians[name]:.3f} ms ({ratios[name]:.2f}x)" for name in medians}, flush=True)
    return results


def kernels(repeats: int) -> dict:
    torch.manual_seed(0)
    weight = torch.randn(4096, 4096) * 0.02
    linear = torch.nn.Linear(4096, 4096, bias=False)
    with torch.no_grad():
        linear.weight.copy_(weight)
    linear_bf16 = copy.deepcopy(linear).to(torch.bfloat16)
    packed = quantize_w8af32(torch.nn.Sequential(linear), "int8pack")
    dynamic = quantize_w8af32(torch.nn.Sequential(linear), "dynamic")
    scale = weight.abs().amax(1) / 127
    int8 = torch.round(weight / scale[:, None]).to(torch.int8)
    results = {}
    for tokens in (1, 4, 8):
        x = torch.randn(tokens, 4096)
        x_bf16 = x.bfloat16()

        def run(fn):
            def timed():
                with torch.inference_mode():
                    fn()

            return timed

        cases = {
            "fp32": run(lambda x=x: linear(x)),
            "bf16": run(lambda x=x_bf16: linear_bf16(x)),
            "int8 weights + bf16 compute (_weight_int8pack_mm)": run(lambda x=x: packed(x)),
            "int8 weights + fp32 compute (dequantize every call)": run(
                lambda x=x: torch.nn.functional.linear(x, int8.float() * scale[:, None])
            ),
            "dynamic int8 (quantize_dynamic)": run(lambda x=x: dynamic(x)),
        }
        medians = {name: median_ms(values) for name, values in interleaved(cases, repeats).seconds.items()}
        results[f"M={tokens}"] = {
            "median_ms": medians,
            "speedup_vs_fp32": {name: round(medians["fp32"] / value, 2) for name, value in medians.items()},
        }
        print(f"4096x4096 M={tokens}", {name: f"{value:.3f}" for name, value in medians.items()}, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--name", default="xeon_draft_step")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    payload = {
        "what": "median ms of one draft decode step (1 token on a 128-position KV cache), cases interleaved; "
        "ratio_vs_fp32 < 1 is faster. Kernel table: one 4096x4096 linear at M tokens.",
        "threads": torch.get_num_threads(),
        "draft_decode_step": draft_steps(args.repeats),
        "kernels_4096x4096": kernels(max(5, args.repeats // 2)),
    }
    write_result(args.name, command_line("xeon_draft_step"), payload)


if __name__ == "__main__":
    main()

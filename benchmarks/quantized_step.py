"""One decode step (M = 1) and verify passes (M = 4, 5, 11) of SmolLM2-135M with fp32 / bf16 / int8 / int4
weights: its linear layers alone and the whole model, eager, interleaved medians; prefill of 128- and 512-token
prompts in tokens/s; this CPU's memory read bandwidth and the floor it puts under a step (weight bytes /
bandwidth); optionally torch.compile.

    python -m benchmarks.quantized_step [--threads 1] [--repeats 7] [--compile [fp32 bf16 int8 int4]]

Variants (all from the same GGUF file through `assisted_backends.quantized.load_gguf_quantized`):
  fp32  scheme "dense": gguf's exact values as fp32 nn.Linear weights (what transformers loads)
  bf16  the fp32 model cast to bf16 (weights and activations)
  int8  scheme "int8": per-row int8 from the exact values, `_weight_int8pack_mm`, bf16 compute
  int4  scheme "file": the file's blocks as-is on the package's own kernels (`quantized.blocks`: Q4_1 codes
        4-bit, the Q8_0 embedding / tied head 8-bit; activations int8 per 32-block, integer dot products)
  int4_aten  the same file on PyTorch's kernels (the fallback: `_weight_int4pack_mm_for_cpu`, group 32,
        bf16 compute; the Q8_0 table as two int4 planes), loaded with ASSISTED_BACKENDS_KERNELS=aten
The whole-model step feeds M new tokens after a 64-token prompt held in a DynamicCache (cropped back after
every call). --compile also times torch.compile (Inductor, dynamic=False) of the named variants' whole-model
step on a static cache (all four when none is named) against eager on the same cache, and the compile time.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch import nn

from assisted_backends import hf_compat
from assisted_backends.quantized.linear import QuantizedLinear
from benchmarks.harness import RESULTS, command_line, ensure_real_gguf, interleaved, write_result
from benchmarks.harness.memory import read_bandwidth_gbs, tensor_bytes

ROWS = (1, 4, 5, 11)
PROMPT = 64
PREFILL = (128, 512)


def load_variants() -> dict[str, nn.Module]:
    import os

    from assisted_backends.native.extension import SWITCH_VARIABLE
    from assisted_backends.quantized.model import load_gguf_quantized

    path = ensure_real_gguf("smollm2-135m-instruct")
    dense = load_gguf_quantized(path, scheme="dense", tokenizer=False).model
    variants = {
        "fp32": dense,
        "bf16": load_gguf_quantized(path, scheme="dense", tokenizer=False).model.to(torch.bfloat16),
        "int8": load_gguf_quantized(path, scheme="int8", tokenizer=False).reference,
        "int4": load_gguf_quantized(path, scheme="file", tokenizer=False).reference,
    }
    os.environ[SWITCH_VARIABLE] = "aten"
    variants["int4_aten"] = load_gguf_quantized(path, scheme="file", tokenizer=False).reference
    del os.environ[SWITCH_VARIABLE]
    return variants


def linear_layers(model: nn.Module) -> list[nn.Module]:
    """Every matmul of a step: the decoder's linear layers and the LM head."""
    return [m for m in model.modules() if isinstance(m, (nn.Linear, QuantizedLinear))]


def linear_step(layers: list[nn.Module], rows: int, dtype: torch.dtype):
    """A callable running every layer once on `rows` rows."""
    generator = torch.Generator().manual_seed(1)
    inputs = {k: torch.randn(rows, k, generator=generator).to(dtype) for k in {layer.in_features for layer in layers}}

    def run() -> None:
        with torch.inference_mode():
            for layer in layers:
                layer(inputs[layer.in_features])

    return run


def model_step(model: nn.Module, rows: int, static: bool = False):
    """A callable feeding `rows` new tokens after a cached 64-token prompt: a DynamicCache cropped back after
    every call, or (`static`) a StaticCache whose write position moves back (fixed shapes: what a compiled
    step of the static layout sees)."""
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, PROMPT), generator=generator)
    new = torch.randint(0, vocab, (1, rows), generator=generator)
    if static:
        cache = hf_compat.new_static_cache(model, 1, PROMPT + max(ROWS), model.dtype, torch.device("cpu"))
    else:
        cache = hf_compat.new_dynamic_cache(model)
    positions = {"cache_position": torch.arange(PROMPT, PROMPT + rows)} if static else {}
    with torch.inference_mode():
        first = {"cache_position": torch.arange(PROMPT)} if static else {}
        model(prompt, use_cache=True, **first, **hf_compat.cache_kwargs(model, cache))

    def run() -> None:
        if static:
            hf_compat.set_static_cache_length(cache, PROMPT)
        with torch.inference_mode():
            model(new, use_cache=True, **positions, **hf_compat.cache_kwargs(model, cache))
        if not static:
            hf_compat.crop_dynamic_cache(cache, PROMPT)

    return run


def prefill(model: nn.Module, tokens: int):
    """A callable running a `tokens`-long prompt through `model` from an empty cache (a chat turn's history)."""
    prompt = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(2))

    def run() -> None:
        with torch.inference_mode():
            model(prompt, use_cache=True, **hf_compat.cache_kwargs(model, hf_compat.new_dynamic_cache(model)))

    return run


def compile_probe(model: nn.Module, repeats: int) -> dict:
    """Compile seconds, and eager / compiled ms by M, for the whole-model step of `model` on a static cache."""
    compiled_model = torch.compile(model, dynamic=False)
    began = time.perf_counter()
    compiled = {rows: model_step(compiled_model, rows, static=True) for rows in ROWS}
    for run in compiled.values():
        run()
        run()
    seconds = time.perf_counter() - began
    eager = {f"eager_{r}": model_step(model, r, static=True) for r in ROWS}
    cases = eager | {f"compiled_{r}": compiled[r] for r in ROWS}
    median = interleaved(cases, repeats, warmup=1).medians()
    return {
        "compile_s": round(seconds, 1),
        "eager_ms": {r: round(1000 * median[f"eager_{r}"], 2) for r in ROWS},
        "compiled_ms": {r: round(1000 * median[f"compiled_{r}"], 2) for r in ROWS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--compile", nargs="*", choices=("fp32", "bf16", "int8", "int4", "int4_aten"), default=None,
        help="also time torch.compile of these variants' step (none named: all four)",
    )  # fmt: skip
    parser.add_argument("--variants", nargs="*", default=None, help="only these variants (default: all)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    bandwidth = read_bandwidth_gbs()
    models = load_variants()
    models = {name: model for name, model in models.items() if not args.variants or name in args.variants}
    cases = {}
    for name, model in models.items():
        layers = linear_layers(model)
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        for rows in ROWS:
            cases[f"{name}_linear_{rows}"] = linear_step(layers, rows, dtype)
            cases[f"{name}_model_{rows}"] = model_step(model, rows)
        for tokens in PREFILL:
            cases[f"{name}_prefill_{tokens}"] = prefill(model, tokens)
    median = interleaved(cases, args.repeats, warmup=1).medians()
    rows_out = {}
    for name, model in models.items():
        weights = tensor_bytes(linear_layers(model))
        step = median[f"{name}_model_1"]
        rows_out[name] = {
            "weight_mb": round(weights / 1e6, 1),
            "floor_ms": round(1000 * weights / (bandwidth * 1e9), 2),
            "linear_ms": {r: round(1000 * median[f"{name}_linear_{r}"], 2) for r in ROWS},
            "model_ms": {r: round(1000 * median[f"{name}_model_{r}"], 2) for r in ROWS},
            "verify_in_steps": {r: round(median[f"{name}_model_{r}"] / step, 3) for r in ROWS if r > 1},
            "prefill_tokens_per_s": {t: round(t / median[f"{name}_prefill_{t}"], 1) for t in PREFILL},
        }
        print(name, rows_out[name], flush=True)
    payload = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "threads": args.threads,
               "read_bandwidth_gbs_1_thread": round(bandwidth, 2), "variants": rows_out}  # fmt: skip
    if args.compile is not None:
        for name in args.compile or list(models):
            torch._dynamo.reset()  # each variant compiles alone
            payload[f"torch_compile_{name}"] = compile_probe(models[name], args.repeats)
            print(name, payload[f"torch_compile_{name}"], flush=True)
    write_result("quantized_step", command_line("quantized_step"), payload, args.out or RESULTS / "quantized_step.json")


if __name__ == "__main__":
    main()

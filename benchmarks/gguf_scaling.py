"""Paper-sized models on a CPU: this package against llama.cpp on the same random-weight GGUF files.

    python -m benchmarks.gguf_scaling          # 0.5B, 1.5B, 3B, 7B x Q4_0, Q8_0, 1 and 2 threads
    python -m benchmarks.gguf_scaling --sizes 0.5B --quants Q4_0 --threads 1 --new-tokens 8 --repeats 1   # smoke
    python -m benchmarks.gguf_scaling --quants Q4_K      # the K-quant files (0.5B's 896-wide rows fall back to Q5_0)
    python -m benchmarks.gguf_scaling --quants Q4_K_M    # llama-quantize's Q4_K_M mix: Q6_K for some v / down / head
    python -m benchmarks.gguf_scaling --quants Q5_K_M    # the same with Q5_K (Q5_1 where columns % 256 != 0)

Speed does not depend on the weights' values, so each file holds random blocks in the shapes of a
Llama-family model (0.5B: Qwen2.5-0.5B's, 1.5B: Qwen2.5-1.5B's, 3B: Llama 3.2 3B's, 7B: Llama 2 7B's), written
with the `gguf` package into `<cache>/scaling/`; both engines read the same file. Per size, quantization and
thread count: plain greedy decoding tok/s of both engines (interleaved, medians with [min, max]; a short
prompt, EOS ignored), the package's verify pass over 4 and 5 tokens in decode steps, its first and cached load
time, and the peak resident memory of each engine measured in a child process that loads the file and
decodes a few tokens.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import assisted_backends
from assisted_backends.cache_dir import cache_root
from benchmarks.harness import RESULTS, command_line, interleaved, step_seconds, write_result
from benchmarks.harness.llama_cpp import llama_cpp_available, llama_cpp_decoder
from benchmarks.harness.memory import peak_rss_kib


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool


SHAPES = {
    "0.5B": Shape(896, 4864, 24, 14, 2, 151936, True),
    "1.5B": Shape(1536, 8960, 28, 12, 2, 151936, True),
    "3B": Shape(3072, 8192, 28, 24, 8, 128256, True),
    "7B": Shape(4096, 11008, 32, 32, 32, 32000, False),
}
BLOCK_BYTES = {"Q4_0": 18, "Q8_0": 34}  # per 32 weights: an fp16 scale, then 16 bytes of nibbles / 32 int8
QUANTS = ("Q4_0", "Q8_0", "Q4_K", "Q4_K_M", "Q5_K_M")
# (weights per block, bytes per block, the fp16 values at its start). Q4_K: d, dmin, 12 bytes of 6-bit scales and
# mins (any bytes are valid), 128 bytes of nibbles; w = d·sc_j·q − dmin·m_j, centred near 0 by dmin ≈ 7.5·d.
# Q5_0 (d, 4 bytes of fifth bits, 16 of nibbles) is what llama-quantize gives a Q4_K file's tensors whose rows
# are not a multiple of 256 long (0.5B's 896 columns); the file keeps the mix a real Q4_K file would have.
_LAYOUT = {
    "Q4_0": (32, 18, (0.01,)),
    "Q8_0": (32, 34, (0.01,)),
    "Q5_0": (32, 22, (0.005,)),
    "Q4_K": (256, 144, (2e-4, 1.5e-3)),
    "Q5_K": (256, 176, (1e-4, 1.5e-3)),  # as Q4_K, then 32 bytes of fifth bits before the nibbles: dmin ≈ 15·d
    "Q5_1": (32, 24, (0.005, -0.08)),  # d, m, 4 bytes of fifth bits, 16 of nibbles: m ≈ −16·d
    "Q6_K": (256, 210, ()),  # ql, qh, 16 int8 sub-scales (any bytes are valid), then d (fp16) at byte 208
}
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # llama-quantize's, where columns % 256 != 0
_Q6_K_D = 1e-4


def tensor_kind(quant: str, name: str, layer: int, layers: int) -> str:
    """The block kind of one matrix: `quant` itself, except in the "Q4_K_M" and "Q5_K_M" mixes, which follow
    llama-quantize's recipes in outline: Q6_K for the output head (the embedding when tied) and for attn_v and
    ffn_down in the first and last eighth of the layers and every third layer between, Q4_K (Q5_K) elsewhere."""
    if quant not in ("Q4_K_M", "Q5_K_M"):
        return quant
    if name in ("output", "token_embd_tied"):
        return "Q6_K"
    more_bits = layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2
    return "Q6_K" if name in ("attn_v", "ffn_down") and more_bits else quant[:4]


def _block_kind(quant: str, columns: int) -> str:
    per_block = _LAYOUT[quant][0]
    return quant if columns % per_block == 0 else _FALLBACK[quant]


def _random_blocks(rows: int, columns: int, quant: str, rng: np.random.Generator) -> np.ndarray:
    """[rows, columns / block * block bytes] uint8: random codes (and random 6-bit sub-scales for Q4_K), each
    block's fp16 scale(s) small constants (Q4_0 / Q8_0: 0.01)."""
    per_block, size, scales = _LAYOUT[quant]
    blocks = rows * columns // per_block
    data = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
    data[:, : 2 * len(scales)] = np.frombuffer(np.array(scales, dtype=np.float16).tobytes(), dtype=np.uint8)
    if quant == "Q6_K":
        data[:, 208:210] = np.frombuffer(np.array([_Q6_K_D], dtype=np.float16).tobytes(), dtype=np.uint8)
    return data.reshape(rows, columns // per_block * size)


def write_random_gguf(size: str, quant: str, path: Path, seed: int = 0) -> Path:
    """A Llama-architecture GGUF file of shape SHAPES[size], every matrix `quant` blocks of random codes (Q4_K:
    matrices whose rows are not a multiple of 256 long in Q5_0, as llama-quantize writes them; "Q4_K_M" and
    "Q5_K_M": the mixes of `tensor_kind`)."""
    import gguf

    shape, rng = SHAPES[size], np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random-{size}")
    writer.add_context_length(4096)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    specials = ["<unk>", "<s>", "</s>"]
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tokens = specials + bytes_ + [f"t{i}" for i in range(shape.vocab - len(specials) - 256)]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * shape.vocab)
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * (shape.vocab - 259))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def matrix(name: str, role: str, rows: int, columns: int, layer: int = -1) -> None:
        block_kind = _block_kind(tensor_kind(quant, role, layer, shape.layers), columns)
        data = _random_blocks(rows, columns, block_kind, rng)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=getattr(gguf.GGMLQuantizationType, block_kind))

    head_dim = shape.hidden // shape.heads
    matrix("token_embd.weight", "token_embd_tied" if shape.tied else "token_embd", shape.vocab, shape.hidden)
    if not shape.tied:
        matrix("output.weight", "output", shape.vocab, shape.hidden)
    writer.add_tensor("output_norm.weight", np.ones(shape.hidden, dtype=np.float32))
    for layer in range(shape.layers):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        for role, rows, columns in (
            ("attn_q", shape.hidden, shape.hidden), ("attn_k", shape.kv_heads * head_dim, shape.hidden),
            ("attn_v", shape.kv_heads * head_dim, shape.hidden), ("attn_output", shape.hidden, shape.hidden),
            ("ffn_gate", shape.intermediate, shape.hidden), ("ffn_up", shape.intermediate, shape.hidden),
            ("ffn_down", shape.hidden, shape.intermediate),
        ):  # fmt: skip
            matrix(f"blk.{layer}.{role}.weight", role, rows, columns, layer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def random_file(size: str, quant: str) -> Path:
    """The cached random file for (size, quant), written on first use (atomically)."""
    path = cache_root() / "scaling" / f"random-{size}-{quant}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        partial = path.with_suffix(".partial")
        write_random_gguf(size, quant, partial)
        partial.rename(path)
    return path


# --- the engines -----------------------------------------------------------------------------------------


def ours(path: Path):
    """(the package's model for `path`, seconds the load took)."""
    from assisted_backends.loading.models import load_model

    began = time.perf_counter()
    model = load_model(str(path))
    return model, time.perf_counter() - began


def ours_decoder(model, prompt: torch.Tensor, new_tokens: int):
    from assisted_backends import generate

    def run() -> list[int]:
        result = generate(model, prompt, max_new_tokens=new_tokens, eos_token_id=[], pad_token_id=0, device="cpu")
        return result.sequences[0, prompt.shape[1] :].tolist()

    return run


def peak_memory_mb(engine: str, path: Path, threads: int) -> float:
    """Peak resident memory of a child process that loads `path` with `engine` and decodes 4 tokens."""
    child = [sys.executable, "-m", "benchmarks.gguf_scaling", "--child", engine, "--file", str(path),
             "--threads", str(threads)]  # fmt: skip
    done = subprocess.run(child, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return float("nan")
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def child(engine: str, path: Path, threads: int) -> None:
    assisted_backends.set_threads(threads)  # fixed for the API too (its probe would pick its own count)
    prompt = torch.arange(10, 26)[None]
    if engine == "ours":
        model, _ = ours(path)
        ours_decoder(model, prompt, 4)()
    else:
        llama_cpp_decoder(path, prompt, 4, threads, n_ctx=512)()
    print(json.dumps({"peak_rss_mb": round(peak_rss_kib() / 1024, 1)}))


# --- one case ----------------------------------------------------------------------------------------------


def measure(size: str, quant: str, args) -> list[dict]:
    path = random_file(size, quant)
    first_load = None
    if not any((cache_root() / "quantized").glob(f"random-{size}-{quant}-*")):
        _, first_load = ours(path)  # repacks and caches
    model, cached_load = ours(path)
    prompt = torch.arange(10, 26)[None]  # 16 tokens
    rows = []
    for threads in args.threads:
        assisted_backends.set_threads(threads)  # fixed for the API too (its probe would pick its own count)
        cases = {"ours_plain": ours_decoder(model, prompt, args.new_tokens)}
        if args.llama_cpp:
            cases["llama_cpp_plain"] = llama_cpp_decoder(path, prompt, args.new_tokens, threads, n_ctx=512)
        timings = interleaved(cases, args.repeats, warmup=1, order="alternate")
        median = timings.medians()
        step = step_seconds(model, prompt, 1, repeats=5)
        row = {
            "size": size,
            "quant": quant,
            "threads": threads,
            "file_gb": round(path.stat().st_size / 1e9, 3),
            "new_tokens": args.new_tokens,
            "tokens_per_s": {name: round(args.new_tokens / seconds, 3) for name, seconds in median.items()},
            "spread_s": {name: [round(lo, 3), round(hi, 3)] for name, (lo, hi) in timings.spread().items()},
            "ours_step_ms": round(1000 * step, 1),
            "ours_verify_4_in_steps": round(step_seconds(model, prompt, 4, repeats=5) / step, 3),
            "ours_verify_5_in_steps": round(step_seconds(model, prompt, 5, repeats=5) / step, 3),
            "ours_load_s": {"first": round(first_load, 1) if first_load else None, "cached": round(cached_load, 1)},
        }
        if "llama_cpp_plain" in median:
            row["ours_vs_llama_cpp"] = round(median["llama_cpp_plain"] / median["ours_plain"], 3)
        if args.memory:
            row["peak_rss_mb"] = {"ours": peak_memory_mb("ours", path, threads)}
            if args.llama_cpp:
                row["peak_rss_mb"]["llama_cpp"] = peak_memory_mb("llama_cpp", path, threads)
        rows.append(row)
        print(json.dumps(row), flush=True)
    del model
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--quants", nargs="+", choices=QUANTS, default=list(BLOCK_BYTES))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--no-memory", action="store_true", help="skip the child processes measuring peak memory")
    parser.add_argument("--child", choices=("ours", "llama_cpp"), help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.child:
        child(args.child, Path(args.file), args.threads[0])
        return
    args.llama_cpp = not args.no_llama_cpp and llama_cpp_available()
    args.memory = not args.no_memory
    results = []
    for size in args.sizes:
        for quant in args.quants:
            print(f"measuring {size} {quant} ...", file=sys.stderr, flush=True)
            results += measure(size, quant, args)
            payload = {"what": __doc__.split("\n\n")[2].replace("\n", " "), "llama_cpp": args.llama_cpp,
                       "results": results}  # fmt: skip
            write_result(
                "gguf_scaling", command_line("gguf_scaling"), payload, args.out or RESULTS / "gguf_scaling.json"
            )


if __name__ == "__main__":
    main()

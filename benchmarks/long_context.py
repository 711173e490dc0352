"""The native decoder step's decode speed deep into a context: a real `.gguf` model's tokens/s at cache depths
512 / 2048 / 4096 (8192 on request), at 1 and 2 threads, with an fp32 and an fp16 KV cache (`kv_cache_dtype`),
against llama.cpp's `llama-bench -d` on the same file where its tools are built.

    python -m benchmarks.long_context [--model smollm2-135m-instruct] [--depths 512 2048 4096] [--threads 1 2]
                                      [--caches fp32 fp16] [--tokens 16] [--repeats 5] [--no-llama-bench]
                                      [--output long_context]

Per depth, one fp32 prefill fills the cache (in chunks of 512 tokens); a half cache is the same cache rounded.
Per thread count, interleaved medians of `tokens` greedy steps after it (the cache cut back after each timed call),
with the share of the step the decoder's own clock puts in the attention. The figures are printed; `--output NAME`
also writes benchmarks/results/NAME.json. llama.cpp's tools are built by `python -m benchmarks.harness.
llama_cpp_tools` (about 10 minutes of CPU); this script never builds them.
"""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks.harness import command_line, ensure_real_gguf, interleaved, write_result

PREFILL_CHUNK = 512


def _filled_cache(native, depth: int):
    """A cache holding `depth` positions of a fixed prompt (prefilled natively in chunks), and the next token."""
    cache = native.new_native_cache()
    tokens = (torch.arange(depth) * 7919 % 20000 + 100)[None]
    with torch.inference_mode():
        for begin in range(0, depth, PREFILL_CHUNK):
            logits = native(tokens[:, begin : begin + PREFILL_CHUNK], past_key_values=cache, logits_to_keep=1).logits
    return cache, logits[:, -1:].argmax(-1)


def _rounded(native, cache, dtype_name: str):
    """`cache`'s positions in a new cache of `native` (its own storage type: fp16 rounds to nearest even)."""
    copy = native.new_native_cache()
    for source, target in zip(cache.layers, copy.layers, strict=True):
        target.keys, target.values = source.keys, source.values
    assert copy.length == cache.length and copy.keys[0].dtype == native.kv_cache_dtype, dtype_name
    return copy


def _decode(native, cache, first: torch.Tensor, depth: int, tokens: int):
    """One timed call: `tokens` greedy steps from position `depth`, the cache cut back to it afterwards."""

    def run() -> None:
        token = first
        with torch.inference_mode():
            for position in range(depth, depth + tokens):
                out = native(token, past_key_values=cache, logits_to_keep=1, cache_position=torch.tensor([position]),
                             position_ids=torch.tensor([[position]]))  # fmt: skip
                token = out.logits[:, -1:].argmax(-1)
        cache.crop(depth)

    return run


def _attention_share(native, run) -> float:
    """The share of the native step's own clock spent in the attention kernel's calls over one run."""
    native._native.reset_timings()
    run()
    _, attention, inside, _ = native._native.timings()
    return attention / max(inside, 1)


def _llama_bench(path, depths: list[int], threads: list[int], tokens: int) -> dict | None:
    from benchmarks.harness.llama_cpp_tools import _run, llama_cpp_tools, parse_bench

    tools = llama_cpp_tools(build=False)
    if "llama-bench" not in tools:
        print("llama-bench is not built here (python -m benchmarks.harness.llama_cpp_tools builds it): skipped")
        return None
    command = [str(tools["llama-bench"]), "-m", str(path), "-t", ",".join(map(str, threads)), "-p", "0", "-n",
               str(tokens), "-d", ",".join(map(str, depths)), "-r", "3", "-o", "json"]  # fmt: skip
    rows = parse_bench(_run(command, 7200)[0])
    rates = {f"{row['threads']}@{row['n_depth']}": row["avg_ts"] for row in rows if row["n_gen"]}
    return {"command": " ".join(command), "decode_tok_s": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a real model (smollm2-135m-instruct, "
                        "gemma-3-270m)")  # fmt: skip
    parser.add_argument("--depths", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--caches", nargs="+", default=["fp32", "fp16"], help="kv_cache_dtype names")
    parser.add_argument("--tokens", type=int, default=16, help="greedy steps per timed call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-llama-bench", action="store_true")
    parser.add_argument("--output", default=None, help="also write benchmarks/results/<OUTPUT>.json")
    arguments = parser.parse_args()

    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized.model import load_gguf_quantized

    path = ensure_real_gguf(arguments.model)
    reference = load_gguf_quantized(path, tokenizer=False).reference
    natives = {name: NativeCausalLM(reference, kv_cache_dtype=name) for name in arguments.caches}
    fp32 = natives.get("fp32") or NativeCausalLM(reference)
    results: dict[str, dict] = {}
    for depth in arguments.depths:
        filled, first = _filled_cache(fp32, depth)
        caches = {name: _rounded(native, filled, name) for name, native in natives.items()}
        del filled
        for threads in arguments.threads:
            torch.set_num_threads(threads)
            cases = {
                name: _decode(natives[name], cache, first, depth, arguments.tokens) for name, cache in caches.items()
            }
            medians = interleaved(cases, arguments.repeats).medians()
            for name, run in cases.items():
                entry = {"decode_tok_s": arguments.tokens / medians[name],
                         "attention_share": _attention_share(natives[name], run),
                         "cache_mib": sum(t[:, :, :depth].nbytes for t in caches[name].keys + caches[name].values)
                         / (1 << 20), "load_average_1min": os.getloadavg()[0]}  # fmt: skip
                results[f"{name} {threads}t @{depth}"] = entry
                print(f"depth {depth:5d}  {threads} thread(s)  {name} cache ({entry['cache_mib']:.0f} MiB): "
                      f"{entry['decode_tok_s']:.1f} tok/s, attention {100 * entry['attention_share']:.0f}% of the "
                      f"step (load {entry['load_average_1min']:.1f})")  # fmt: skip
    llama = None if arguments.no_llama_bench else _llama_bench(path, arguments.depths, arguments.threads,
                                                               arguments.tokens)  # fmt: skip
    if llama:
        for key, rate in llama["decode_tok_s"].items():
            threads, depth = key.split("@")
            ours = {name: results[f"{name} {threads}t @{depth}"]["decode_tok_s"] for name in arguments.caches}
            print(
                f"llama-bench depth {depth} {threads} thread(s): {rate:.1f} tok/s; ours / llama.cpp: "
                + ", ".join(f"{name} {value / rate:.2f}x" for name, value in ours.items())
            )
    if arguments.output:
        write_result(arguments.output, command_line("long_context"), {
            "model": path.name, "tokens_per_call": arguments.tokens, "repeats": arguments.repeats,
            "native": results, "llama_bench": llama})  # fmt: skip


if __name__ == "__main__":
    main()

"""Batches on this CPU: throughput and per-row latency of plain and assisted decoding as B grows.

    python -m benchmarks.batched                      # both pairs, B = 1 2 4 8 16, fp32 and bf16
    python -m benchmarks.batched --pairs demo --batches 1 4 --dtypes fp32 --repeats 2   # a quick look

For each pair, dtype and batch size B it runs, interleaved (the order rotates every repeat, so drift
in machine load hits every method alike), B different prompts through
- `plain`: this package's loop without a drafter (plain batched decoding),
- `adaptive`: assisted, the adaptive schedule (γ chosen from measured costs, 0 when it cannot win),
- `constant`: assisted, a fixed γ (demo: a draft model at γ = 4; SmolLM2: prompt lookup of 10 tokens),
- `transformers`: transformers' own batched `model.generate` (plain),
each generating exactly `--new-tokens` tokens per row (EOS ignored). Reported per method (medians over
repeats): aggregate tokens/s (all rows' tokens / wall time), mean per-row latency (time until a row's
last token), α, target passes, and the share of decode time spent realigning rows (`engine.realign`).
Speedup = method tokens/s / plain tokens/s. Pairs: the embedded demo pair (12 M target, draft model)
and SmolLM2-135M-Instruct (PyPI wheel, see benchmarks/harness/gguf_wheels.py) asked to rewrite stdlib
functions (input-grounded: prompt lookup finds the function in its prompt).
Writes benchmarks/results/batched.json (with the command) and batched.png.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import torch

from assisted_backends import generate
from assisted_backends.api.queue import left_padded
from assisted_backends.backends.cpu.affinity import set_threads
from benchmarks.harness import RESULTS, command_line, demo_pair, ensure_real_model, interleaved, write_result

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
METHODS = ("plain", "adaptive", "constant", "transformers")


def demo(dtype: torch.dtype):
    """The demo pair: a draft model at γ = 4 (constant) or adaptive; 16 different 64-token passages."""
    pair = demo_pair(dtype)
    ids = pair.tokenizer(pair.held_out_text).input_ids
    prompts = [ids[b * 64 : (b + 1) * 64] for b in range(16)]
    constant, adaptive = dict(assistant_model=pair.draft, num_assistant_tokens=4), dict(assistant_model=pair.draft)
    return pair.target, constant, adaptive, prompts, pair.tokenizer


def _stdlib_functions(count: int) -> list[str]:
    import json.decoder
    import shlex as shlex_module
    import string

    sources = []
    for module in (textwrap, shlex_module, string, json.decoder, statistics, inspect):
        for _, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ != module.__name__:
                continue
            source = inspect.getsource(function)
            if 8 <= source.count("\n") <= 25:
                sources.append(textwrap.dedent(source))
            if len(sources) == count:
                return sources
    return sources


def smollm2_pair(dtype: torch.dtype):
    """SmolLM2 with prompt lookup (10 tokens), asked to rewrite 16 stdlib functions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = ensure_real_model("smollm2-135m-instruct")
    target = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompts = []
    for source in _stdlib_functions(16):
        message = f"Rewrite this Python function with type hints, keeping its body as it is:\n\n```python\n{source}```"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids)
    lookup = dict(prompt_lookup_num_tokens=10)
    return target, dict(lookup, schedule="constant"), dict(lookup, schedule="adaptive"), prompts, tokenizer


PAIRS = {"demo": demo, "smollm2-lookup": smollm2_pair}


def run_method(method: str, target, constant: dict, adaptive: dict, ids, mask, pad_id: int, new_tokens: int) -> dict:
    """One batched run of `method`: its wall time, tokens/s and (for this package) per-row latency, α, passes."""
    began = time.perf_counter()
    if method == "transformers":
        with torch.inference_mode():
            target.generate(
                ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                pad_token_id=pad_id,
            )  # fmt: skip
        total = time.perf_counter() - began
        return {"total_s": total, "tokens_per_s": ids.shape[0] * new_tokens / total}
    drafting = {"plain": {}, "constant": constant, "adaptive": adaptive}[method]
    result = generate(
        target, ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=[], pad_token_id=pad_id, **drafting
    )
    total = time.perf_counter() - began
    stats = result.stats
    return {
        "total_s": total,
        "tokens_per_s": stats.new_tokens / total,
        "row_latency_s": statistics.mean(row.finished_s for row in stats.rows),
        "acceptance_rate": stats.acceptance_rate,
        "verify_passes": stats.verify_passes,
        "move_share": stats.move_s / stats.decode_s if stats.decode_s else 0.0,
    }


def median_summary(runs: list[dict]) -> dict:
    keys = runs[0].keys()
    return {
        key: statistics.median(values) if (values := [r[key] for r in runs if r.get(key) is not None]) else None
        for key in keys
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", choices=tuple(PAIRS), default=list(PAIRS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="default: every usable core")
    parser.add_argument("--out", type=Path, default=RESULTS / "batched.json")
    args = parser.parse_args()
    threads = set_threads(args.threads)
    results = []
    for pair_name in args.pairs:
        for dtype_name in args.dtypes:
            target, constant, adaptive, prompts, tokenizer = PAIRS[pair_name](DTYPES[dtype_name])
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
            for batch in args.batches:
                ids, mask = left_padded([torch.tensor(p) for p in prompts[:batch]], pad_id)
                run = partial(run_method, target=target, constant=constant, adaptive=adaptive, ids=ids, mask=mask)
                for method in METHODS:  # warm-up: first-call costs stay out
                    run(method, pad_id=pad_id, new_tokens=4)
                cases = {m: partial(run, m, pad_id=pad_id, new_tokens=args.new_tokens) for m in METHODS}
                runs = interleaved(cases, args.repeats, warmup=0, order="rotate").outputs  # each run times itself
                summary = {method: median_summary(values) for method, values in runs.items()}
                plain = summary["plain"]["tokens_per_s"]
                for method in METHODS:
                    summary[method]["speedup_vs_plain"] = summary[method]["tokens_per_s"] / plain
                results.append({"pair": pair_name, "dtype": dtype_name, "batch": batch, "methods": summary})
                line = "  ".join(
                    f"{m} {summary[m]['tokens_per_s']:.0f} tok/s ({summary[m]['speedup_vs_plain']:.2f}x)"
                    for m in METHODS
                )
                print(f"{pair_name:15s} {dtype_name} B={batch:2d}: {line}", flush=True)
    payload = {"threads": threads, "new_tokens_per_row": args.new_tokens, "repeats": args.repeats, "results": results}
    out = write_result("batched", command_line("batched"), payload, args.out)  # machine: CPU, load average at the end
    plot(results, out.with_suffix(".png"))


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for pair, dtype in sorted({(r["pair"], r["dtype"]) for r in results}):
        rows = [r for r in results if r["pair"] == pair and r["dtype"] == dtype]
        batches = [r["batch"] for r in rows]
        for axis, method in zip(axes, ("adaptive", "constant")):
            axis.plot(
                batches, [r["methods"][method]["speedup_vs_plain"] for r in rows], marker="o", label=f"{pair} {dtype}"
            )
    for axis, method in zip(axes, ("adaptive", "constant")):
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("batch size B")
        axis.set_ylabel("aggregate tokens/s vs plain batched decoding")
        axis.set_title(f"assisted ({method} schedule)")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()

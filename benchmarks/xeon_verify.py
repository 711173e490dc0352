"""Target verify step with K+1 tokens against one decode step, bf16 and fp32 (why speculation pays).

A verify step feeds K+1 tokens on top of the KV cache; a decode step feeds one. Where bf16 runs on
AMX or AVX512-BF16, a step is bound by reading the weights once, so K+1 tokens should cost about as
much as one. Cases run interleaved; medians; reported as t(K+1) / t(1) per dtype, and bf16 / fp32 per
token count.

    python -m benchmarks.xeon_verify            # ~3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import copy
import warnings

import torch

from benchmarks.harness import command_line, forward_step, interleaved, median_ms, random_llama, write_result

TARGETS = {  # label: (hidden, layers, vocabulary, heads)
    "h1024 x 8, V 32000 (~190M)": (1024, 8, 32000, 8),
    "h384 x 6, V 4096 (the demo target's shape, random weights)": (384, 6, 4096, 6),
}
TOKENS = (1, 2, 4, 5, 9)  # K + 1 for K = 0 (a decode step), 1, 3, 4, 8
CONTEXT = 256  # positions in the KV cache


def _step(model: torch.nn.Module, tokens: int):
    """One forward of `tokens` random tokens on a cache of CONTEXT random tokens."""
    vocab = model.config.vocab_size
    context = torch.randint(0, vocab, (1, CONTEXT))
    return forward_step(model, context, tokens, fed=torch.randint(0, vocab, (1, tokens)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    for label, (hidden, layers, vocab, heads) in TARGETS.items():
        fp32 = random_llama(hidden, layers, vocab, heads=heads, seed=0)
        models = {"fp32": fp32, "bf16": copy.deepcopy(fp32).to(torch.bfloat16)}
        cases = {f"{dtype} q={q}": _step(model, q) for dtype, model in models.items() for q in TOKENS}
        medians = {name: median_ms(values) for name, values in interleaved(cases, args.repeats).seconds.items()}
        table = {}
        for dtype in models:
            one = medians[f"{dtype} q=1"]
            table[dtype] = {
                f"K+1={q}": {
                    "median_ms": medians[f"{dtype} q={q}"],
                    "vs_one_decode_step": round(medians[f"{dtype} q={q}"] / one, 3),
                }
                for q in TOKENS
            }
        table["bf16_vs_fp32"] = {f"K+1={q}": round(medians[f"bf16 q={q}"] / medians[f"fp32 q={q}"], 3) for q in TOKENS}
        results[label] = table
        for dtype in models:
            print(label, dtype, {k: v["vs_one_decode_step"] for k, v in table[dtype].items()}, flush=True)
        print(label, "bf16/fp32", table["bf16_vs_fp32"], flush=True)
    payload = {
        "what": "target forward of K+1 new tokens on a 256-position KV cache vs one token (median ms, interleaved)",
        "threads": torch.get_num_threads(),
        "verify": results,
    }
    write_result("xeon_verify", command_line("xeon_verify"), payload)


if __name__ == "__main__":
    main()

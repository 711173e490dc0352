"""This package against transformers' own generate, and against the Leviathan limit, in one run.

    python -m benchmarks.peer_compare                 # all pairs, writes benchmarks/results/peer_compare.json
    python -m benchmarks.peer_compare --pairs demo --repeats 3
    python -m benchmarks.peer_compare --pairs demo --dtype bf16 --out benchmarks/results/peer_compare_bf16.json

Per pair, five methods run interleaved (round-robin, `--repeats` times; medians): transformers'
plain `generate`, transformers' assisted `generate`, and this package's plain, constant-γ and
adaptive decoding. Pairs:
- self: a random Llama (hidden 1024 x 8 layers) as its own draft (every token accepted, c ≈ 1);
- unrelated: the same target with an unrelated random draft (hidden 256 x 2; almost nothing accepted);
- demo: the embedded demo pair (trained here; mid-range acceptance);
- early_exit: the demo target drafting with its own first 2 layers.
The theoretical speedup S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) uses α from the constant-γ run
and c = t_draft / t_target measured with single-token forward passes on warm caches; it assumes every
draft token is accepted independently with probability α. Real acceptances are correlated (a draft
that got one token of a phrase right tends to get the next), so the tokens a round really yields, E,
can exceed the formula's, and measured/S can exceed 1. The limit for the acceptance actually observed
is S_E = E / (γc + 1) with E the constant-γ run's mean tokens per round: the speedup of an
implementation whose only costs are γ draft steps and one target step per round;
efficiency = measured speedup / S_E.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from assisted_backends import generate
from assisted_backends.drafters.early_exit import early_exit_view
from benchmarks.harness import (
    RESULTS,
    command_line,
    cost_ratio,
    demo_pair,
    interleaved,
    leviathan_speedup,
    measured_limit,
    random_llama,
    write_result,
)


def random_target(hidden: int, layers: int, seed: int) -> torch.nn.Module:
    """A random Llama with 32k vocabulary, heads of 64, an 11/4 MLP (the self and unrelated pairs)."""
    heads = hidden // 64
    return random_llama(hidden, layers, 32000, heads=heads, kv_heads=heads, intermediate=hidden * 11 // 4, seed=seed)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_pairs(names: list[str], dtype: torch.dtype = torch.float32):
    pairs = {}
    if {"self", "unrelated"} & set(names):
        target = random_target(1024, 8, seed=0).to(dtype)
        prompt = torch.randint(0, 32000, (1, 128), generator=torch.Generator().manual_seed(0))
        if "self" in names:
            pairs["self"] = dict(target=target, draft=target, prompt=prompt, new_tokens=48, early_exit=None)
        if "unrelated" in names:
            draft = random_target(256, 2, seed=1).to(dtype)
            pairs["unrelated"] = dict(target=target, draft=draft, prompt=prompt, new_tokens=48, early_exit=None)
    if {"demo", "early_exit"} & set(names):
        demo = demo_pair(dtype)
        target = demo.target
        prompt = torch.tensor([demo.tokenizer(demo.held_out_text[:20000]).input_ids[:128]])
        if "demo" in names:
            draft = demo.draft
            pairs["demo"] = dict(target=target, draft=draft, prompt=prompt, new_tokens=128, early_exit=None)
        if "early_exit" in names:
            pairs["early_exit"] = dict(
                target=target, draft=early_exit_view(target, 2), prompt=prompt, new_tokens=128, early_exit=2
            )
    return pairs


def methods(pair: dict, gamma: int):
    target, draft, prompt, new = pair["target"], pair["draft"], pair["prompt"], pair["new_tokens"]
    mask = torch.ones_like(prompt)
    common = dict(max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)

    def hf_plain():
        with torch.inference_mode():
            return target.generate(prompt, attention_mask=mask, **common)

    def hf_assisted():
        with torch.inference_mode():
            if pair["early_exit"] is not None:
                return target.generate(prompt, attention_mask=mask, assistant_early_exit=pair["early_exit"], **common)
            return target.generate(prompt, attention_mask=mask, assistant_model=draft, **common)

    ours = dict(max_new_tokens=new, eos_token_id=[], device="cpu")
    drafting = (
        dict(assistant_early_exit=pair["early_exit"]) if pair["early_exit"] is not None else dict(assistant_model=draft)
    )
    return {
        "hf_plain": hf_plain,
        "hf_assisted": hf_assisted,
        "ours_plain": lambda: generate(target, prompt, **ours),
        "ours_constant": lambda: generate(target, prompt, num_assistant_tokens=gamma, **drafting, **ours),
        "ours_adaptive": lambda: generate(target, prompt, schedule="adaptive", **drafting, **ours),
    }


def measure(pair: dict, gamma: int, repeats: int) -> dict:
    runs = methods(pair, gamma)
    outputs = {name: run() for name, run in runs.items()}  # warm-up, and the identity check below
    reference = outputs["hf_plain"][0].tolist()
    identical = {
        name: (out.sequences if hasattr(out, "sequences") else out)[0].tolist() == reference
        for name, out in outputs.items()
    }
    timings = interleaved(runs, repeats, warmup=0)
    stats = {name: timings.last(name).stats for name in ("ours_constant", "ours_adaptive")}
    median = timings.medians()
    alpha = stats["ours_constant"].acceptance_rate or 0.0
    c, t_target, t_draft = cost_ratio(pair["target"], pair["draft"], pair["prompt"], repeats=15)
    theory = leviathan_speedup(alpha, gamma, c)
    tokens_per_round = stats["ours_constant"].mean_accepted_length
    limit = measured_limit(tokens_per_round, gamma, c)
    speedup = median["ours_plain"] / median["ours_constant"]
    adaptive_stats = stats["ours_adaptive"]
    return {
        "median_s": median,
        "identical_to_hf_plain": identical,
        "alpha": alpha,
        "gamma": gamma,
        "c": c,
        "t_target_step_ms": 1000 * t_target,
        "t_draft_step_ms": 1000 * t_draft,
        "theoretical_speedup_S": theory,
        "tokens_per_round_E": tokens_per_round,
        "limit_S_E": limit,
        "speedup_constant_vs_ours_plain": speedup,
        "efficiency_vs_S": speedup / theory,
        "efficiency_vs_S_E": speedup / limit,
        "speedup_adaptive_vs_ours_plain": median["ours_plain"] / median["ours_adaptive"],
        "adaptive_drafted": adaptive_stats.drafted,
        "adaptive_rounds": adaptive_stats.rounds,
        "ours_plain_vs_hf_plain": median["ours_plain"] / median["hf_plain"],
        "hf_assisted_vs_hf_plain": median["hf_assisted"] / median["hf_plain"],
        "ours_constant_vs_hf_assisted_speedup": median["hf_assisted"] / median["ours_constant"],
        "ours_adaptive_vs_hf_assisted_speedup": median["hf_assisted"] / median["ours_adaptive"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=["self", "unrelated", "demo", "early_exit"])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="every model of every pair")
    parser.add_argument("--out", default=str(RESULTS / "peer_compare.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for name, pair in build_pairs(args.pairs, DTYPES[args.dtype]).items():
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        results[name] = measure(pair, args.gamma, args.repeats)
    header = (
        f"{'pair':<11} {'alpha':>5} {'c':>5} {'S':>5} {'E':>5} {'S_E':>5} {'constant':>8} {'eff S_E':>7} "
        f"{'adaptive':>8} {'const/HF asst':>13} {'adapt/HF asst':>13} {'plain ours/HF':>13}"
    )
    print(header)
    for name, r in results.items():
        print(
            f"{name:<11} {r['alpha']:5.2f} {r['c']:5.2f} {r['theoretical_speedup_S']:5.2f} "
            f"{r['tokens_per_round_E']:5.2f} {r['limit_S_E']:5.2f} {r['speedup_constant_vs_ours_plain']:7.2f}x "
            f"{r['efficiency_vs_S_E']:7.2f} {r['speedup_adaptive_vs_ours_plain']:7.2f}x "
            f"{r['ours_constant_vs_hf_assisted_speedup']:12.2f}x {r['ours_adaptive_vs_hf_assisted_speedup']:12.2f}x "
            f"{r['ours_plain_vs_hf_plain']:12.3f}x"
        )
    payload = {
        "dtype": args.dtype,
        "torch_threads": torch.get_num_threads(),
        "notes": "ratios < 1 in *_vs_* entries named time/time mean faster; speedups > 1 mean faster",
        "pairs": results,
    }
    write_result("peer_compare", command_line("peer_compare"), payload, Path(args.out))


if __name__ == "__main__":
    main()

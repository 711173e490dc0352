"""Acceptance rate with a w8af32 draft against an fp32 draft, on a small trained pair.

The pair (`--pair demo`: the package's embedded demo pair, a 6 x 384 Llama target and a 1 x 128 draft
trained together on the standard library's source; `--pair bytes`: a byte-level pair trained here,
see benchmarks/harness/byte_pair.py) is run greedily through `assisted_backends.generate` on held-out prompts, with
the fp32 target verifying every draft precision. Reported: α = accepted /
drafted per precision, its drop against fp32 in points (goal: ≤ 2), and whether every output was
token-identical to the fp32 draft's (it must be: the target decides).

    python -m benchmarks.xeon_acceptance                 # ~2 minutes on 2 cores
    python -m benchmarks.xeon_acceptance --pair bytes    # trains its pair first (~6 minutes)
"""

from __future__ import annotations

import argparse

import torch

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu import quantize
from assisted_backends.backends.cpu.backend import CPUBackend
from benchmarks.harness import add_pair_arguments, command_line, pair_and_prompts, write_result

PRECISIONS = ("fp32", "bf16", "w8af32[dynamic]", "w8af32[int8pack]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(parser, prompts=16)
    args = parser.parse_args()
    target, draft, inputs, pair_description = pair_and_prompts(args)

    results, outputs = {}, {}
    for name in PRECISIONS:
        precision, _, method = name.partition("[")
        if method:
            quantize.DEFAULT_METHOD = method.rstrip("]")
        backend = CPUBackend(BackendOptions(dtype="fp32", draft_precision=precision))
        drafted = accepted = 0
        sequences = []
        for prompt in inputs:
            result = generate(
                target,
                prompt,
                assistant_model=draft,
                max_new_tokens=args.new_tokens,
                num_assistant_tokens=args.gamma,
                backend=backend,
            )
            drafted += result.stats.drafted
            accepted += result.stats.accepted
            sequences.append(result.sequences)
        outputs[name] = sequences
        results[name] = {"drafted": drafted, "accepted": accepted, "acceptance_rate": round(accepted / drafted, 4)}
        print(name, results[name], flush=True)

    base = results["fp32"]["acceptance_rate"]
    for name, row in results.items():
        row["drop_vs_fp32_points"] = round(100 * (base - row["acceptance_rate"]), 2)
        row["identical_output_to_fp32_draft"] = all(
            torch.equal(a, b) for a, b in zip(outputs[name], outputs["fp32"], strict=True)
        )
    payload = {
        "what": "greedy acceptance rate (accepted / drafted) on held-out prompts; fp32 target verifies every draft",
        "pair": pair_description,
        "settings": vars(args),
        "threads": torch.get_num_threads(),
        "acceptance": results,
        "goal": "w8af32 drop <= 2 points",
    }
    write_result("xeon_acceptance", command_line("xeon_acceptance"), payload)


if __name__ == "__main__":
    main()

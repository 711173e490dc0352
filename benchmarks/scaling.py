"""Time per token against prompt length and new tokens, assisted vs plain, and peak memory of each.

    python -m benchmarks.scaling                    # writes benchmarks/results/scaling.json (+ .png with matplotlib)
    python -m benchmarks.scaling --quick

The loop must add no cost that grows with the sequence beyond the models' own attention: no
re-encoding or copying of the prefix per step and no per-step cache copies. So the cost of one
assisted round (γ draft steps + one verify pass), in plain decode steps of the same case, should stay
flat as the prompt and the output grow. The assisted/plain time per token also depends on α, which
for the demo pair falls on prompts longer than the 128-token windows it was trained on; the adaptive
schedule's column shows what a user gets there. Plain, constant-γ and adaptive runs alternate per case
(medians over --repeats). Peak memory is the resident-set high-water mark of a
fresh subprocess that loads the pair and runs the largest case in one mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from functools import partial
from pathlib import Path

import torch

from assisted_backends import generate
from benchmarks.harness import RESULTS, command_line, demo_pair, interleaved, write_result
from benchmarks.harness.memory import peak_rss_kib

REPO = Path(__file__).resolve().parents[1]


def load_pair():
    """(target, draft, held-out token ids) of the demo pair, fp32."""
    pair = demo_pair(torch.float32)
    return pair.target, pair.draft, pair.tokenizer(pair.held_out_text).input_ids


MODES = ("plain", "assisted", "adaptive")  # plain decoding, constant γ, the adaptive schedule


def run(target, draft, source, prompt_length: int, new_tokens: int, mode: str, gamma: int):
    """One generation in `mode` on a prompt of `prompt_length` tokens (the held-out text, repeated); its stats."""
    prompt = torch.tensor([(source * (1 + prompt_length // len(source)))[:prompt_length]])
    extra = {
        "plain": {},
        "assisted": dict(assistant_model=draft, num_assistant_tokens=gamma),
        "adaptive": dict(assistant_model=draft, schedule="adaptive"),
    }[mode]
    return generate(target, prompt, max_new_tokens=new_tokens, eos_token_id=[], device="cpu", **extra).stats


def memory_probe(mode: str, prompt_length: int, new_tokens: int, gamma: int) -> None:
    """Print this process's peak resident memory (and its growth during one generation) as JSON."""
    target, draft, source = load_pair()
    baseline = peak_rss_kib()
    run(target, draft, source, prompt_length, new_tokens, mode, gamma)
    peak = peak_rss_kib()
    print(json.dumps({"peak_rss_mib": peak / 1024, "generation_rss_growth_mib": (peak - baseline) / 1024}))


def plot(rows: list[dict], path: Path) -> None:
    """Left: ms per token, plain and adaptive (what a user gets). Right: one constant-γ round in plain
    decode steps of the same case (flat = the loop adds nothing that grows with the sequence)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install '.[plot]'): no plot", file=sys.stderr)
        return
    figure, (per_token, per_round) = plt.subplots(1, 2, figsize=(11, 4))
    for new_tokens in sorted({r["new_tokens"] for r in rows}):
        points = [r for r in rows if r["new_tokens"] == new_tokens]
        prompts = [r["prompt_tokens"] for r in points]

        def values(key: str) -> list[float]:
            return [r[key] for r in points]  # noqa: B023 (used at once)

        line = per_token.plot(prompts, values("plain_ms_per_token"), "o--", label=f"plain, {new_tokens} new")
        color = line[0].get_color()
        per_token.plot(prompts, values("adaptive_ms_per_token"), "o-", color=color, label=f"adaptive, {new_tokens} new")
        per_round.plot(prompts, values("assisted_round_over_plain_token"), "o-", color=color, label=f"{new_tokens} new")
    for axis in (per_token, per_round):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("prompt tokens")
        axis.legend(fontsize=7)
    per_token.set_ylabel("ms per generated token (after prefill)")
    per_round.set_ylabel("one γ-round (γ draft steps + verify) / plain step")
    per_round.set_ylim(0, None)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", default=str(RESULTS / "scaling.json"), help="JSON path (the plot goes next to it)")
    parser.add_argument("--quick", action="store_true", help="prompts 256/1024, new tokens 64/256, 2 repeats")
    parser.add_argument("--memory-probe", choices=["plain", "assisted"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.prompt_lengths, args.new_tokens, args.repeats = [256, 1024], [64, 256], 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        memory_probe(args.memory_probe, max(args.prompt_lengths), max(args.new_tokens), args.gamma)
        return

    target, draft, source = load_pair()
    run(target, draft, source, 32, 8, "assisted", args.gamma)  # warm-up
    rows = []
    for prompt_length in args.prompt_lengths:
        for new_tokens in args.new_tokens:
            case = partial(run, target, draft, source, prompt_length, new_tokens, gamma=args.gamma)
            cases = {mode: partial(case, mode=mode) for mode in MODES}
            stats = interleaved(cases, args.repeats, warmup=0, order="alternate").outputs
            times = {mode: [s.decode_s / max(1, s.new_tokens - 1) for s in stats[mode]] for mode in MODES}
            alpha = [s.acceptance_rate for s in stats["assisted"]]
            round_ms = [1000 * s.decode_s / max(1, s.rounds) for s in stats["assisted"]]
            plain, assisted = statistics.median(times["plain"]), statistics.median(times["assisted"])
            adaptive = statistics.median(times["adaptive"])
            row = {
                "prompt_tokens": prompt_length,
                "new_tokens": new_tokens,
                "plain_ms_per_token": 1000 * plain,
                "assisted_ms_per_token": 1000 * assisted,
                "assisted_over_plain": assisted / plain,
                "adaptive_ms_per_token": 1000 * adaptive,
                "adaptive_over_plain": adaptive / plain,
                "acceptance_rate": statistics.median(alpha),
                "assisted_ms_per_round": statistics.median(round_ms),
                "assisted_round_over_plain_token": statistics.median(round_ms) / (1000 * plain),
            }
            rows.append(row)
            print(
                f"prompt {prompt_length:5d} new {new_tokens:5d}: plain {1000 * plain:7.2f} ms/token, assisted "
                f"{1000 * assisted:7.2f} ms/token ({assisted / plain:.2f}x time), "
                f"adaptive {adaptive / plain:.2f}x time, α {row['acceptance_rate']:.2f}, "
                f"{row['assisted_ms_per_round']:.2f} ms/round "
                f"({row['assisted_round_over_plain_token']:.2f} plain steps)",
                flush=True,
            )

    memory = {}
    for mode in ("plain", "assisted"):  # peak memory of plain decoding and of constant-γ assisted decoding
        command = [
            sys.executable,
            "-m",
            "benchmarks.scaling",
            "--memory-probe",
            mode,
            "--gamma",
            str(args.gamma),
            "--prompt-lengths",
            str(max(args.prompt_lengths)),
            "--new-tokens",
            str(max(args.new_tokens)),
        ]
        probe = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO)
        output = probe.stdout.strip().splitlines()[-1]
        memory[mode] = json.loads(output)
    print(
        f"peak RSS (prompt {max(args.prompt_lengths)}, {max(args.new_tokens)} new tokens): "
        f"plain {memory['plain']['peak_rss_mib']:.0f} MiB, assisted {memory['assisted']['peak_rss_mib']:.0f} MiB"
    )

    payload = {
        "torch_threads": torch.get_num_threads(),
        "pair": "embedded demo pair (fp32); assisted = constant γ, adaptive = the adaptive schedule",
        "gamma": args.gamma,
        "rows": rows,
        "peak_memory": memory,
    }
    out = write_result("scaling", command_line("scaling"), payload, Path(args.out))
    plot(rows, out.with_suffix(".png"))


if __name__ == "__main__":
    main()

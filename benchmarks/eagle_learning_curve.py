"""The learning curve of a `train-draft` run: held-out acceptance against the training it has had.

    python -m benchmarks.eagle_learning_curve                      # the chat heads of <cache>/chat_heads/*
    python -m benchmarks.eagle_learning_curve --runs DIR [DIR ...]

Reads each run directory's `training.json` (written by `train-draft` at every checkpoint and at the end): its
held-out evaluations, taken every `--eval-every` seconds while training, on the run's own held-out prompts. Each
row: training steps, the positions they covered (steps x batch size x the mean positions per training
sequence: what more data or a faster device would add), minutes since the run began (data generation
included), α_1 (the head's first draft token), α = (E − 1)/γ and E(γ) as `train-draft` reports them. Nothing is
timed here; the numbers are the run's.

Then an extrapolation, labelled as one: a least-squares line E = a + b log2(positions) through the curve's second
half (the positions past half of the last row's), the positions at which that line reaches `--target-e`, and the
hours of training they would take at the run's own rate (its positions over its training seconds). The curve
repeats the run's sequences epoch after epoch, so the line is what more of the same training buys; new data is
expected to do better, a saturating head worse.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from assisted_backends.loading.files import cache_root
from assisted_backends.train_draft import ttt
from benchmarks.harness import command_line, write_result


def curve(run: Path) -> dict:
    report = json.loads((run / "training.json").read_text())
    settings = report["settings"]
    gamma = len(report["latest"] or report["untrained"])
    per_sequence = report["positions"] / max(report["sequences"], 1)
    rows = [dict(step=0, positions=0, minutes=None, rates=report["untrained"])]
    for entry in report["history"]:
        positions = round(entry["step"] * settings["batch_size"] * per_sequence)
        rows.append(dict(step=entry["step"], positions=positions, minutes=round(entry["seconds"] / 60, 1),
                         rates=entry["rates"]))  # fmt: skip
    for row in rows:
        expected = ttt.expected_tokens(row["rates"], gamma)
        row.update(alpha_1=round(row["rates"][0], 3), alpha=round((expected - 1) / gamma, 3), E=round(expected, 3))
    return {"run": str(run), "target": settings["target"], "chat": settings.get("chat"), "gamma": gamma,
            "sequences": report["sequences"], "positions": report["positions"], "seconds": report["seconds"],
            "curve": rows}  # fmt: skip


def extrapolate(result: dict, target_e: float) -> dict | None:
    """The log-linear line through the second half of `result`'s curve and where it reaches E = `target_e`."""
    last = result["curve"][-1]["positions"]
    later = [row for row in result["curve"] if row["positions"] and row["positions"] >= last / 2]
    points = [(math.log2(row["positions"]), row["E"]) for row in later]
    if len({x for x, _ in points}) < 3:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    rate = last / result["seconds"]["train"]  # training positions per second, as the run went
    needed = 2 ** (mean_x + (target_e - mean_y) / slope) if slope > 0 else math.inf
    return {"target_E": target_e, "E_per_doubling": round(slope, 3), "points": len(points),
            "positions_needed": None if math.isinf(needed) else round(needed),
            "training_positions_per_s": round(rate, 1),
            "hours_needed": None if math.isinf(needed) else round(needed / rate / 3600, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="*", default=None, help="run directories (default <cache>/chat_heads/*)")
    parser.add_argument("--target-e", type=float, default=2.2, help="the E(γ) the extrapolation aims at")
    parser.add_argument("--out", default="eagle_learning_curve")
    args = parser.parse_args()
    runs = [Path(r) for r in args.runs] if args.runs else sorted((cache_root() / "chat_heads").glob("*"))
    results = [curve(run) for run in runs if (run / "training.json").is_file()]
    for result in results:
        print(f"{result['target']}: {result['sequences']} sequences, {result['positions']} positions")
        for row in result["curve"]:
            minutes = "untrained" if row["minutes"] is None else f"{row['minutes']:5.1f} min"
            print(f"  step {row['step']:5d}  positions {row['positions']:8d}  {minutes:>9}  α_1 {row['alpha_1']:.3f}"
                  f"  α {row['alpha']:.3f}  E({result['gamma']}) {row['E']:.2f}")  # fmt: skip
        line = result["extrapolation"] = extrapolate(result, args.target_e)
        if line is not None:
            rate = line["training_positions_per_s"]
            print(f"  extrapolated (log-linear over the last half, not measured): E +{line['E_per_doubling']:.3f} per"
                  f" doubling of positions; E = {args.target_e} at {line['positions_needed'] or 'never'} positions,"
                  f" {line['hours_needed'] or '-'} h at this run's {rate} positions/s")  # fmt: skip
    write_result(args.out, command_line("eagle_learning_curve"), {"results": results})


if __name__ == "__main__":
    main()

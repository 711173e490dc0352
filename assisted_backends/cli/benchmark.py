"""`--task benchmark`: the seed benchmarks' table, measured through one code path.

Columns (defined in docs/cli.md, "The benchmark task"): Total Time = prefill + decode; Prefill Phase =
the prompt's forward pass(es) and the first token; Time/Token = everything after the prefill (drafting
included) divided by the tokens generated after the first; Tokens/Sec = new tokens / Total Time. With
`--compare` plain and assisted runs alternate (A B, then B A) on every case; each pair gives one speedup,
and the row shows their median with a distribution-free interval (`speedup_interval`). A case keeps
adding pairs until that interval settles or `--time-limit` passes. EOS is ignored so every case generates
exactly the tokens it names. With `--batch-size N` each case runs N different prompts of its length at
once: New Tokens is per row, Tokens/Sec is the aggregate (all rows' tokens / Total Time), Row Latency the
mean time until a row's last token; `--compare` then also times transformers' own batched
`model.generate` (plain) in the same interleaved order."""

from __future__ import annotations

import csv
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from assisted_backends.cli.preflight import INSTALL_PLOT
from assisted_backends.cli.session import Session
from assisted_backends.cli.spread import INTERVAL_COVERAGE, median_interval, run_pairs

DEFAULT_PROMPT_LENGTHS = (256, 512)
DEFAULT_NEW_TOKENS = (64, 128, 256, 512, 1024)
QUICK_PROMPT_LENGTHS = (128,)
QUICK_NEW_TOKENS = (64, 128)

COLUMNS = [
    ("Example#", "example", "{}"),
    ("Batch", "batch_size", "{}"),
    ("Prompt Length (tokens)", "prompt_tokens", "{}"),
    ("New Tokens Generated", "new_tokens", "{}"),
    ("Total Time (s)", "total_s", "{:.3f}"),
    ("Prefill Phase (ms)", "prefill_ms", "{:.1f}"),
    ("Time/Token (ms)", "time_per_token_ms", "{:.2f}"),
    ("Tokens/Sec", "tokens_per_s", "{:.1f}"),
    ("Row Latency (s)", "row_latency_s", "{:.3f}"),
]
ASSISTED_COLUMNS = [
    ("Acceptance Rate", "acceptance_rate", "{:.2f}"),
    ("Mean Accepted Length", "mean_accepted_length", "{:.2f}"),
]
SPECULATIVE_COLUMNS = [
    ("Tokens/Spec. Round", "tokens_per_speculative_round", "{:.2f}"),
    ("Plain Rounds", "plain_round_share", "{:.0%}"),
]
COMPARE_COLUMNS = [
    ("Plain Tokens/Sec", "plain_tokens_per_s", "{:.1f}"),
    ("transformers Tokens/Sec", "transformers_tokens_per_s", "{:.1f}"),
    ("Speedup", "speedup", "{:.2f}x"),
    ("vs transformers", "speedup_vs_transformers", "{:.2f}x"),
    ("Speedup Interval", "speedup_interval_text", "{}"),
    ("Pairs", "pairs", "{}"),
    ("Settled", "settled_text", "{}"),
]


@dataclass
class Measurement:
    total_s: float
    prefill_s: float
    decode_s: float
    new_tokens: int
    acceptance_rate: float | None
    mean_accepted_length: float | None
    tokens_per_speculative_round: float | None = None
    plain_round_share: float | None = None
    rows: int = 1
    row_latency_s: float | None = None


def prompt_source(session: Session) -> list[int]:
    """A long token sequence to cut prompts from: the demo pair's held-out text, a prompt file, or stdlib text."""
    args = session.args
    if getattr(args, "prompt_text", None) is not None:
        text = args.prompt_text
    elif args.prompt_file:
        text = open(args.prompt_file, encoding="utf-8").read()
    elif args.prompt:
        text = args.prompt
    elif session.held_out_text:
        text = session.held_out_text
    else:
        from assisted_backends.demo.corpus import read_corpus

        text = read_corpus(400_000)[1]
    ids = session.tokenizer(text).input_ids
    if not ids:
        raise ValueError("the benchmark prompt text is empty; pass --prompt or --prompt-file with some text")
    return ids


def make_prompt(source: list[int], length: int, rows: int = 1) -> torch.Tensor:
    """[rows, length]: exactly `length` tokens per row (the source repeated if it is shorter), row b starting
    b * length tokens further into the source, so the rows of a batch are different prompts."""
    repeats = -(-length * rows // len(source)) + 1
    tokens = source * repeats
    return torch.tensor([tokens[b * length : (b + 1) * length] for b in range(rows)], dtype=torch.long)


def _measure(session: Session, prompt: torch.Tensor, new_tokens: int, mode: str) -> tuple[Measurement, object]:
    if mode == "transformers":
        return _measure_transformers(session, prompt, new_tokens)
    result = session.generate(
        prompt, new_tokens, assisted=mode == "assisted", ignore_eos=True, attention_mask=_batch_mask(prompt)
    )
    s = result.stats
    return Measurement(
        s.total_s,
        s.prefill_s,
        s.decode_s,
        s.new_tokens,
        s.acceptance_rate,
        s.mean_accepted_length,
        s.tokens_per_speculative_round,
        s.plain_rounds / s.rounds if s.rounds else None,
        rows=prompt.shape[0],
        row_latency_s=statistics.mean(row.finished_s for row in s.rows) if prompt.shape[0] > 1 else None,
    ), result


def _batch_mask(prompt: torch.Tensor) -> torch.Tensor | None:
    return torch.ones_like(prompt) if prompt.shape[0] > 1 else None  # equal lengths: nothing is padded


def _measure_transformers(session: Session, prompt: torch.Tensor, new_tokens: int) -> tuple[Measurement, object]:
    """transformers' own plain `model.generate` on the same batch (no prefill split: it is not reported)."""
    session.backend.synchronize()
    began = time.perf_counter()
    sequences = session.transformers_generate(prompt, torch.ones_like(prompt), new_tokens)
    session.backend.synchronize()
    total = time.perf_counter() - began
    rows = prompt.shape[0]
    new = (sequences.shape[1] - prompt.shape[1]) * rows
    return Measurement(total, 0.0, total, new, None, None, rows=rows), None


def _median_of(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _median_row(runs: list[Measurement]) -> dict:
    total = statistics.median(m.total_s for m in runs)
    rows = runs[0].rows
    new_tokens = runs[0].new_tokens // rows  # per row
    decode = statistics.median(m.decode_s for m in runs)
    rates = [m.acceptance_rate for m in runs if m.acceptance_rate is not None]
    lengths = [
        m.mean_accepted_length for m in runs if m.mean_accepted_length is not None and m.acceptance_rate is not None
    ]
    return {
        "batch_size": rows,
        "new_tokens": new_tokens,
        "total_s": total,
        "prefill_ms": 1000 * statistics.median(m.prefill_s for m in runs),
        "time_per_token_ms": 1000 * decode / max(1, new_tokens - 1),
        "tokens_per_s": new_tokens * rows / total if total > 0 else float("inf"),
        "row_latency_s": _median_of(m.row_latency_s for m in runs),
        "acceptance_rate": statistics.median(rates) if rates else None,
        "mean_accepted_length": statistics.median(lengths) if lengths else None,
        "tokens_per_speculative_round": _median_of(m.tokens_per_speculative_round for m in runs),
        "plain_round_share": _median_of(m.plain_round_share for m in runs),
    }


def run_benchmark(session: Session, rows: list[dict]) -> str:
    """Measure every case, appending each finished row to `rows` (kept on Ctrl-C); return a sample of text."""
    args = session.args
    prompt_lengths = args.prompt_lengths or (QUICK_PROMPT_LENGTHS if args.quick else DEFAULT_PROMPT_LENGTHS)
    new_token_counts = args.new_tokens or (QUICK_NEW_TOKENS if args.quick else DEFAULT_NEW_TOKENS)
    modes = ["plain", "assisted"] if args.compare else (["plain"] if args.no_assisted else ["assisted"])
    if args.compare:
        modes.insert(1, "transformers")
    source = prompt_source(session)
    cases = [(p, n) for p in prompt_lengths for n in new_token_counts]

    warm = make_prompt(source, min(prompt_lengths), args.batch_size)
    for mode in modes:  # first-call costs (allocations, kernel selection) stay out of the table
        _measure(session, warm, 8, mode)

    sample = ""
    for example, (prompt_length, new_tokens) in enumerate(cases):
        prompt = make_prompt(source, prompt_length, args.batch_size)
        runs: dict[str, list[Measurement]] = {mode: [] for mode in modes}

        def measure_pair(repeat: int, prompt=prompt, new_tokens=new_tokens, runs=runs) -> float:
            nonlocal sample
            order = modes if repeat % 2 == 0 else list(reversed(modes))
            for mode in order:
                measurement, result = _measure(session, prompt, new_tokens, mode)
                runs[mode].append(measurement)
                if not sample and mode == modes[-1]:
                    sample = session.tokenizer.decode(result.sequences[0, prompt.shape[1] :], skip_special_tokens=True)
            return runs["plain"][-1].total_s / runs[modes[-1]][-1].total_s if args.compare else 1.0

        if args.compare:
            speedups, settled = run_pairs(measure_pair, args.repeats, args.time_limit)
        else:
            speedups, settled = [measure_pair(repeat) for repeat in range(args.repeats)], True
        main_mode = modes[-1]
        row = {"example": example, "prompt_tokens": prompt_length, **_median_row(runs[main_mode])}
        if main_mode == "plain":
            row["acceptance_rate"] = row["mean_accepted_length"] = row["tokens_per_speculative_round"] = None
        if args.compare:
            plain = _median_row(runs["plain"])
            row["plain_total_s"] = plain["total_s"]
            row["plain_time_per_token_ms"] = plain["time_per_token_ms"]
            row["plain_tokens_per_s"] = plain["tokens_per_s"]
            row["transformers_tokens_per_s"] = _median_row(runs["transformers"])["tokens_per_s"]
            row["speedup_vs_transformers"] = row["tokens_per_s"] / row["transformers_tokens_per_s"]
            low, high = median_interval(speedups)
            row["speedup"] = statistics.median(speedups)
            row["speedup_interval"] = [low, high]
            row["pair_speedups"] = speedups
            row["pairs"] = len(speedups)
            row["settled"] = settled
            row["speedup_interval_text"] = f"{low:.2f}-{high:.2f}"
            row["settled_text"] = "yes" if settled else f"NO: spread > effect after {args.time_limit:g} s"
        rows.append(row)
        result = (
            f", speedup {row['speedup']:.2f}x ({row['speedup_interval_text']}, {len(speedups)} pairs)"
            if args.compare
            else ""
        )
        print(f"case {example + 1}/{len(cases)} done: {prompt_length} + {new_tokens} tokens{result}", file=sys.stderr)
    return sample


def legend(assisted: bool, compare: bool) -> str:
    """What the table's derived columns mean, printed under it."""
    lines = ["Time/Token = time after the prefill / (new tokens - 1); Tokens/Sec = new tokens / Total Time."]
    if assisted:
        lines.append(
            "Acceptance Rate = accepted / drafted tokens (speculative rounds only); Mean Accepted Length = tokens "
            "per round over all rounds; Tokens/Spec. Round = tokens per round that drafted (accepted + the "
            "target's own); Plain Rounds = share of rounds with γ = 0 (the schedule found speculation would not pay)."
        )
    if compare:
        lines.append(
            f"Speedup = median over interleaved pairs of plain time / assisted time; Speedup Interval holds that "
            f"median with >= {INTERVAL_COVERAGE:.0%} probability (min-max under 5 pairs); Settled = NO when the "
            f"interval still contains 1 (the spread is wider than the effect): do not trust that row. "
            f"transformers Tokens/Sec = its own model.generate (plain) on the same batch, timed in the same "
            f"interleaved order; vs transformers = assisted Tokens/Sec / that."
        )
    lines.append(
        "Batch = prompts per call; Tokens/Sec counts every row's tokens; Row Latency = mean time until a row's "
        "last token (batches only)."
    )
    return "\n".join(lines)


def format_table(rows: list[dict], assisted: bool, compare: bool) -> str:
    columns = (
        COLUMNS + (ASSISTED_COLUMNS + SPECULATIVE_COLUMNS if assisted else []) + (COMPARE_COLUMNS if compare else [])
    )
    cells = [[title for title, _, _ in columns]]
    for row in rows:
        cells.append([("-" if row.get(key) is None else fmt.format(row[key])) for _, key, fmt in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = [" | ".join(value.rjust(width) for value, width in zip(line, widths)) for line in cells]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def write_json(path: str, rows: list[dict], runtime: dict, settings: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"rows": rows, "runtime": runtime, "settings": settings}, handle, indent=2)


def write_csv(path: str, rows: list[dict]) -> None:
    keys = [key for key in rows[0] if key not in ("pair_speedups", "speedup_interval")] if rows else []
    rows = [{key: row.get(key) for key in keys} for row in rows]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def write_plot(path: str, rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(f"--plot needs matplotlib: {INSTALL_PLOT}") from None
    labels = [f"{r['prompt_tokens']}+{r['new_tokens']}" for r in rows]
    figure, axis = plt.subplots(figsize=(max(6, len(rows) * 0.8), 4))
    axis.bar(labels, [r["speedup"] for r in rows], color="#4c72b0")
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xlabel("prompt tokens + new tokens")
    axis.set_ylabel("speedup (plain time / assisted time)")
    axis.set_title("Assisted vs plain decoding")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)

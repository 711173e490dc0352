"""`--task benchmark`: the seed benchmarks' table, measured through one code path.

Columns (defined in the README): Total Time = prefill + decode; Prefill Phase = the prompt's forward
pass(es) and the first token; Time/Token = everything after the prefill (drafting included) divided
by the tokens generated after the first; Tokens/Sec = new tokens / Total Time. With `--compare`
plain and assisted runs alternate (A B, then B A) on every case and the medians are compared.
EOS is ignored so every case generates exactly the tokens it names.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from dataclasses import dataclass

import torch

from assisted_backends.cli.session import Session

DEFAULT_PROMPT_LENGTHS = (256, 512)
DEFAULT_NEW_TOKENS = (64, 128, 256, 512, 1024)
QUICK_PROMPT_LENGTHS = (128,)
QUICK_NEW_TOKENS = (64, 128)

COLUMNS = [
    ("Example#", "example", "{}"),
    ("Prompt Length (tokens)", "prompt_tokens", "{}"),
    ("New Tokens Generated", "new_tokens", "{}"),
    ("Total Time (s)", "total_s", "{:.3f}"),
    ("Prefill Phase (ms)", "prefill_ms", "{:.1f}"),
    ("Time/Token (ms)", "time_per_token_ms", "{:.2f}"),
    ("Tokens/Sec", "tokens_per_s", "{:.1f}"),
]
ASSISTED_COLUMNS = [
    ("Acceptance Rate", "acceptance_rate", "{:.2f}"),
    ("Mean Accepted Length", "mean_accepted_length", "{:.2f}"),
]
COMPARE_COLUMNS = [("Plain Tokens/Sec", "plain_tokens_per_s", "{:.1f}"), ("Speedup", "speedup", "{:.2f}x")]


@dataclass
class Measurement:
    total_s: float
    prefill_s: float
    decode_s: float
    new_tokens: int
    acceptance_rate: float | None
    mean_accepted_length: float | None


def prompt_source(session: Session) -> list[int]:
    """A long token sequence to cut prompts from: the demo pair's held-out text, a prompt file, or stdlib text."""
    args = session.args
    if args.prompt_file:
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


def make_prompt(source: list[int], length: int) -> torch.Tensor:
    """Exactly `length` tokens (the source repeated if it is shorter)."""
    repeats = -(-length // len(source))
    return torch.tensor([(source * repeats)[:length]], dtype=torch.long)


def _measure(session: Session, prompt: torch.Tensor, new_tokens: int, assisted: bool) -> tuple[Measurement, object]:
    result = session.generate(prompt, new_tokens, assisted=assisted, ignore_eos=True)
    s = result.stats
    return Measurement(
        s.total_s, s.prefill_s, s.decode_s, s.new_tokens, s.acceptance_rate, s.mean_accepted_length
    ), result


def _median_row(runs: list[Measurement]) -> dict:
    total = statistics.median(m.total_s for m in runs)
    new_tokens = runs[0].new_tokens
    decode = statistics.median(m.decode_s for m in runs)
    rates = [m.acceptance_rate for m in runs if m.acceptance_rate is not None]
    lengths = [
        m.mean_accepted_length for m in runs if m.mean_accepted_length is not None and m.acceptance_rate is not None
    ]
    return {
        "new_tokens": new_tokens,
        "total_s": total,
        "prefill_ms": 1000 * statistics.median(m.prefill_s for m in runs),
        "time_per_token_ms": 1000 * decode / max(1, new_tokens - 1),
        "tokens_per_s": new_tokens / total if total > 0 else float("inf"),
        "acceptance_rate": statistics.median(rates) if rates else None,
        "mean_accepted_length": statistics.median(lengths) if lengths else None,
    }


def run_benchmark(session: Session) -> tuple[list[dict], str]:
    """Measure every case; return the rows and a sample of generated text."""
    from tqdm.auto import tqdm

    args = session.args
    prompt_lengths = args.prompt_lengths or (QUICK_PROMPT_LENGTHS if args.quick else DEFAULT_PROMPT_LENGTHS)
    new_token_counts = args.new_tokens or (QUICK_NEW_TOKENS if args.quick else DEFAULT_NEW_TOKENS)
    modes = ["plain", "assisted"] if args.compare else (["plain"] if args.no_assisted else ["assisted"])
    source = prompt_source(session)
    cases = [(p, n) for p in prompt_lengths for n in new_token_counts]

    warm = make_prompt(source, min(prompt_lengths))
    for mode in modes:  # first-call costs (allocations, kernel selection) stay out of the table
        session.generate(warm, 8, assisted=mode == "assisted", ignore_eos=True)

    rows: list[dict] = []
    sample = ""
    bar = tqdm(total=len(cases) * args.repeats * len(modes), desc="benchmark", unit="run", file=sys.stderr)
    for example, (prompt_length, new_tokens) in enumerate(cases):
        prompt = make_prompt(source, prompt_length)
        runs: dict[str, list[Measurement]] = {mode: [] for mode in modes}
        for repeat in range(args.repeats):
            order = modes if repeat % 2 == 0 else list(reversed(modes))
            for mode in order:
                measurement, result = _measure(session, prompt, new_tokens, assisted=mode == "assisted")
                runs[mode].append(measurement)
                if not sample and mode == modes[-1]:
                    sample = session.tokenizer.decode(result.sequences[0, prompt_length:], skip_special_tokens=True)
                bar.update(1)
        main_mode = modes[-1]
        row = {"example": example, "prompt_tokens": prompt_length, **_median_row(runs[main_mode])}
        if main_mode == "plain":
            row["acceptance_rate"] = row["mean_accepted_length"] = None
        if args.compare:
            plain = _median_row(runs["plain"])
            row["plain_total_s"] = plain["total_s"]
            row["plain_time_per_token_ms"] = plain["time_per_token_ms"]
            row["plain_tokens_per_s"] = plain["tokens_per_s"]
            row["speedup"] = plain["total_s"] / row["total_s"]
        rows.append(row)
    bar.close()
    return rows, sample


def format_table(rows: list[dict], assisted: bool, compare: bool) -> str:
    columns = COLUMNS + (ASSISTED_COLUMNS if assisted else []) + (COMPARE_COLUMNS if compare else [])
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
    keys = list(rows[0]) if rows else []
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
        raise RuntimeError("--plot needs matplotlib: pip install assisted_backends[plot]") from None
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

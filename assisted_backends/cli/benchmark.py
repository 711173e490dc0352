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
`model.generate` (plain) in the same interleaved order.

Each run records the CPU it ran under (`affinity.CpuMeter`: this process's CPU per wall second, the CPUs
other processes used); a row whose runs saw different loads is not called settled. Between cases the
thread count is probed again when a probe chose it (`Session.recheck_threads`). The run says its estimated
total before the first case (a full run also what `--quick` would take), every case its estimate before it
starts (`cli.estimate`: rates from the latest runs), again after its first pair, and its result and time."""

from __future__ import annotations

import csv
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from assisted_backends.backends.cpu.affinity import CpuMeter, CpuUse
from assisted_backends.cli.cases import QUICK_NEW_TOKENS, QUICK_PROMPT_LENGTHS, benchmark_cases
from assisted_backends.cli.estimate import CostModel, case_text, seconds_text, total_text
from assisted_backends.cli.preflight import INSTALL_PLOT
from assisted_backends.cli.session import Session
from assisted_backends.cli.spread import INTERVAL_COVERAGE, median_interval, run_pairs

WARM_UP_TOKENS = 8
LOAD_CHANGE_CPUS = 0.5  # runs whose neighbours' CPU use differs by more (beyond /proc/stat's resolution) differ

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
    ("Threads", "threads", "{}"),
    ("Others' CPUs", "others_cpus_text", "{}"),
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
    cpu: CpuUse | None = None


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
    """One run of `mode` on `prompt`, with the CPU use it ran under."""
    with CpuMeter() as meter:
        measurement, result = _measure_run(session, prompt, new_tokens, mode)
    measurement.cpu = meter.use
    return measurement, result


def _measure_run(session: Session, prompt: torch.Tensor, new_tokens: int, mode: str) -> tuple[Measurement, object]:
    if mode == "transformers":
        return _measure_transformers(session, prompt, new_tokens)
    result = session.generate(  # every run computes its whole prompt: no prefix cache (a repeat would be warm)
        prompt, new_tokens, assisted=mode == "assisted", ignore_eos=True, attention_mask=_batch_mask(prompt),
        prefix_cache=False,
    )  # fmt: skip
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


def load_state(runs: list[Measurement]) -> tuple[float, float, bool] | None:
    """(least, most CPUs other processes used during a run, whether every run saw the same load), or None when
    /proc/stat could not be read. "Same": within LOAD_CHANGE_CPUS plus the resolution of a run's reading."""
    uses = [m.cpu for m in runs if m.cpu is not None and m.cpu.others_cpus is not None]
    if not uses:
        return None
    others = [use.others_cpus for use in uses]
    resolution = max(0.02 / max(use.wall_s, 1e-3) for use in uses)  # /proc/stat counts 10 ms ticks
    return min(others), max(others), max(others) - min(others) <= LOAD_CHANGE_CPUS + resolution


def _settled_text(settled: bool, state: tuple[float, float, bool] | None, time_limit: float) -> str:
    if state is not None and not state[2]:
        return f"NO: the load changed between runs (others used {state[0]:.1f}-{state[1]:.1f} CPUs)"
    return "yes" if settled else f"NO: spread > effect after {time_limit:g} s"


def _warm_up(session: Session, modes: list[str], prompt: torch.Tensor, costs: CostModel) -> None:
    """First-call costs (allocations, kernel selection) stay out of the table; the first rates of the cost model."""
    for mode in modes:
        measurement, _ = _measure(session, prompt, WARM_UP_TOKENS, mode)
        costs.record(mode, prompt.shape[1], WARM_UP_TOKENS, measurement.total_s, measurement.prefill_s)


def _recheck_threads(session: Session, modes: list[str], warm: torch.Tensor, costs: CostModel) -> None:
    """Probe the thread count again; on a change say so and warm the new thread count up."""
    changed = session.recheck_threads()
    if changed is not None:
        print(f"threads: now {changed.threads} ({changed.reason})", file=sys.stderr, flush=True)
        _warm_up(session, modes, warm, costs)


def _announce(session: Session, modes: list[str], cases: list[tuple[int, int]], costs: CostModel) -> None:
    """The whole run's estimate before its first case; a full run (no --quick, no cases named) names --quick."""
    args = session.args
    line = f"benchmark: {total_text(costs, modes, cases, args)}"
    if not args.quick and args.prompt_lengths is None and args.new_tokens is None:
        quick = [(p, n) for p in QUICK_PROMPT_LENGTHS for n in QUICK_NEW_TOKENS]
        line += f"; --quick runs {len(quick)} short cases, about {seconds_text(_least(costs, modes, quick, args))}"
    print(line, file=sys.stderr, flush=True)


def _least(costs: CostModel, modes: list[str], cases: list[tuple[int, int]], args) -> float:
    return sum(costs.pair_s(modes, p, n) * args.repeats for p, n in cases)


def _row(args, example: int, prompt_length: int, runs: dict[str, list[Measurement]], modes: list[str]) -> dict:
    """The table row of a case from its runs (every mode's), speedups added by `_compare_columns`."""
    main_mode = modes[-1]
    row = {"example": example, "prompt_tokens": prompt_length, **_median_row(runs[main_mode])}
    if main_mode == "plain":
        row["acceptance_rate"] = row["mean_accepted_length"] = row["tokens_per_speculative_round"] = None
    state = load_state([m for mode in modes for m in runs[mode]])
    row["others_cpus"] = None if state is None else [state[0], state[1]]
    row["others_cpus_text"] = "-" if state is None else f"{state[0]:.1f}-{state[1]:.1f}"
    row["load_steady"] = None if state is None else state[2]
    own = [m.cpu.own_cpus for m in runs[main_mode] if m.cpu is not None]
    row["cpu_per_wall"] = statistics.median(own) if own else None
    return row


def _compare_columns(row: dict, runs: dict[str, list[Measurement]], speedups: list[float], settled: bool, args) -> None:
    plain = _median_row(runs["plain"])
    row["plain_total_s"] = plain["total_s"]
    row["plain_time_per_token_ms"] = plain["time_per_token_ms"]
    row["plain_tokens_per_s"] = plain["tokens_per_s"]
    row["transformers_tokens_per_s"] = _median_row(runs["transformers"])["tokens_per_s"]
    row["speedup_vs_transformers"] = row["tokens_per_s"] / row["transformers_tokens_per_s"]
    low, high = median_interval(speedups)
    steady = row["load_steady"] is not False
    row["speedup"] = statistics.median(speedups)
    row["speedup_interval"] = [low, high]
    row["pair_speedups"] = speedups
    row["pairs"] = len(speedups)
    row["settled"] = settled and steady
    row["speedup_interval_text"] = f"{low:.2f}-{high:.2f}"
    state = None if row["others_cpus"] is None else (*row["others_cpus"], steady)
    row["settled_text"] = _settled_text(settled, state, args.time_limit)


def run_benchmark(session: Session, rows: list[dict]) -> str:
    """Measure every case, appending each finished row to `rows` (kept on Ctrl-C); return a sample of text."""
    args = session.args
    modes = ["plain", "assisted"] if args.compare else (["plain"] if args.no_assisted else ["assisted"])
    if args.compare:
        modes.insert(1, "transformers")
    source = prompt_source(session)
    cases = benchmark_cases(args)
    warm = make_prompt(source, min(p for p, _ in cases), args.batch_size)
    costs = CostModel()  # seconds per prompt token and per new token of each mode, from the latest runs
    _warm_up(session, modes, warm, costs)
    _announce(session, modes, cases, costs)

    sample = ""
    for example, (prompt_length, new_tokens) in enumerate(cases):
        if example:
            _recheck_threads(session, modes, warm, costs)
        prompt = make_prompt(source, prompt_length, args.batch_size)
        runs: dict[str, list[Measurement]] = {mode: [] for mode in modes}
        label = f"case {example + 1}/{len(cases)}"
        estimate = case_text(costs.pair_s(modes, prompt_length, new_tokens), args, costs.pairs_seen)
        print(f"{label}: {prompt_length} + {new_tokens} tokens, {estimate}", file=sys.stderr, flush=True)
        began = time.perf_counter()

        def measure_pair(repeat: int, prompt=prompt, new_tokens=new_tokens, runs=runs, label=label) -> float:
            nonlocal sample
            order = modes if repeat % 2 == 0 else list(reversed(modes))
            pair_began = time.perf_counter()
            for mode in order:
                measurement, result = _measure(session, prompt, new_tokens, mode)
                runs[mode].append(measurement)
                costs.record(mode, prompt.shape[1], new_tokens, measurement.total_s, measurement.prefill_s)
                if not sample and mode == modes[-1]:
                    sample = session.tokenizer.decode(result.sequences[0, prompt.shape[1] :], skip_special_tokens=True)
            if repeat == 0 and args.repeats > 1:  # the case's own first pair: the estimate it gives for the case
                first = time.perf_counter() - pair_began
                revised = case_text(first, args, costs.pairs_seen)
                print(f"{label}: first pair {seconds_text(first)}, {revised} for the case",
                      file=sys.stderr, flush=True)  # fmt: skip
            return runs["plain"][-1].total_s / runs[modes[-1]][-1].total_s if args.compare else 1.0

        if args.compare:
            speedups, settled = run_pairs(measure_pair, args.repeats, args.time_limit)
        else:
            speedups, settled = [measure_pair(repeat) for repeat in range(args.repeats)], True
        costs.pairs_seen.append(len(speedups))
        row = _row(args, example, prompt_length, runs, modes)
        row["threads"] = session.threads.threads if session.threads is not None else None
        if args.compare:
            _compare_columns(row, runs, speedups, settled, args)
        rows.append(row)
        result = (
            f", speedup {row['speedup']:.2f}x ({row['speedup_interval_text']}, {len(speedups)} pairs, "
            f"settled: {row['settled_text']})"
            if args.compare
            else ""
        )
        took = seconds_text(time.perf_counter() - began)
        print(f"{label} done: {prompt_length} + {new_tokens} tokens in {took}{result}", file=sys.stderr, flush=True)
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
            f"interval still contains 1 (the spread is wider than the effect), or when the load changed between its "
            f"runs (Others' CPUs = the least and most CPUs other processes used during a run): do not trust that row. "
            f"transformers Tokens/Sec = its own model.generate (plain) on the same batch, timed in the same "
            f"interleaved order; vs transformers = assisted Tokens/Sec / that."
        )
    lines.append(
        "Batch = prompts per call; Tokens/Sec counts every row's tokens; Row Latency = mean time until a row's "
        "last token (batches only); Threads = torch's CPU threads for the case."
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


def speedup_figure(rows: list[dict]):
    """Speedup per case as a bar with its interval as an error bar; unsettled rows grey, hatched and labelled."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(f"--plot needs matplotlib: {INSTALL_PLOT}") from None
    labels = [f"{r['prompt_tokens']}+{r['new_tokens']}" for r in rows]
    speedups = [r["speedup"] for r in rows]
    below = [s - r["speedup_interval"][0] for s, r in zip(speedups, rows)]
    above = [r["speedup_interval"][1] - s for s, r in zip(speedups, rows)]
    settled = [bool(r.get("settled")) for r in rows]
    figure, axis = plt.subplots(figsize=(max(6, len(rows) * 0.8), 4))
    bars = axis.bar(labels, speedups, color=["#4c72b0" if ok else "#c8c8c8" for ok in settled],
                    yerr=[below, above], capsize=4, ecolor="black")  # fmt: skip
    for bar, ok, row in zip(bars, settled, rows):
        if not ok:
            bar.set_hatch("//")
            axis.annotate("unsettled", (bar.get_x() + bar.get_width() / 2, row["speedup_interval"][1]), ha="center",
                          va="bottom", xytext=(0, 3), textcoords="offset points", fontsize=8)  # fmt: skip
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xlabel("prompt tokens + new tokens")
    axis.set_ylabel("speedup (plain time / assisted time)")
    explained = f"bar: median of the pairs; error bar: its {INTERVAL_COVERAGE:.0%} interval; grey, hatched: unsettled"
    axis.set_title(f"Assisted vs plain decoding\n{explained}", fontsize=10)
    figure.tight_layout()
    return figure


def write_plot(path: str, rows: list[dict]) -> None:
    """`speedup_figure` saved as a PNG."""
    figure = speedup_figure(rows)  # first: it says how to install matplotlib when it is missing
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=120)
    plt.close(figure)

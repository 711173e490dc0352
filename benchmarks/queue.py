"""Queues on this CPU: many prompts through B slots, each refilled as its row ends, against fixed batches.

    python -m benchmarks.queue        # the full run: both pairs, fp32 and bf16, B = 1 2 4 8 16, 64 prompts
    python -m benchmarks.queue --pairs demo --dtypes fp32 --slots 1 2 --prompts 6 --repeats 1 --out /tmp/q.json

A queue of `--prompts` prompts of mixed lengths whose answers end at EOS after mixed numbers of tokens (as
an evaluation set's do), run through B slots by each method, interleaved (the order rotates every repeat,
so drift in machine load hits every method alike):
- `plain`: this package's queue without a drafter (plain batched decoding through the same loop, refilled),
- `adaptive`: the queue, assisted, the adaptive schedule (γ from measured costs at the live batch, 0 when
  speculation cannot win),
- `constant`: the queue, assisted, a fixed γ (demo: a draft model at γ = 4; SmolLM2: prompt lookup of 10),
- `fixed_plain`, `fixed_adaptive`, `fixed_constant`: today's fixed batches, `generate` on consecutive
  groups of B prompts (a group ends with its slowest row),
- `transformers`: transformers' own batched `model.generate` (plain) on the same groups of B.
Reported per method (medians over repeats): tokens/s (every prompt's new tokens / wall time of the whole
queue), per-prompt latency (mean and 90th percentile of the time from the start of the queue until the
prompt's last token; transformers returns a group at once), the mean time a prompt spends in a slot
(queues: from its join to its end), α, target passes, and the share of prompts whose tokens equal the
plain queue's (1.0 in fp32; bf16 may differ at near-ties). Ratios in one run: assisted / plain (queue),
refill / fixed per method. Pairs: the embedded demo pair (12 M target, draft model) continuing held-out
standard-library source with its generate-task settings (repetition penalty 1.2; an answer ends at its
first blank line, EOS or 96 tokens), and SmolLM2-135M-Instruct (PyPI wheel) with prompt lookup, asked
about standard-library functions (rewrite with type hints: long answers; what it returns: short ones;
EOS or 128 tokens). Writes benchmarks/results/queue.json (with the command).
"""

from __future__ import annotations

import argparse
import inspect
import random
import statistics
import textwrap
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from assisted_backends import generate, generate_queue
from assisted_backends.api.queue import left_padded
from assisted_backends.backends.cpu.affinity import set_threads
from benchmarks.harness import RESULTS, command_line, demo_pair, ensure_real_model, interleaved, write_result

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
QUEUED = ("plain", "adaptive", "constant")
FIXED = ("fixed_plain", "fixed_adaptive", "fixed_constant")
METHODS = (*QUEUED, *FIXED, "transformers")


@dataclass
class QueueCase:
    """One pair's queue: the target, the prompts, the options every method shares (EOS, limit, penalty) and
    the drafting options of the `constant` and `adaptive` methods."""

    target: torch.nn.Module
    prompts: list[list[int]]
    shared: dict
    constant: dict
    adaptive: dict
    pad_id: int
    eos: list[int] = field(default_factory=list)

    def drafting(self, method: str) -> dict:
        kind = method.removeprefix("fixed_")
        return {"plain": {}, "constant": self.constant, "adaptive": self.adaptive}[kind]


def demo(dtype: torch.dtype, count: int) -> QueueCase:
    """The demo pair continuing held-out source from `count` places, prompts of 16-128 tokens; an answer ends at
    its first blank line (any token holding one), the tokenizer's EOS, or 96 tokens."""
    pair = demo_pair(dtype)
    tokenizer = pair.tokenizer
    ids = tokenizer(pair.held_out_text).input_ids
    rng = random.Random(0)
    prompts = []
    for _ in range(count):
        length = rng.choice((16, 24, 32, 48, 64, 96, 128))
        start = rng.randrange(0, len(ids) - length)
        prompts.append(ids[start : start + length])
    blank_line = [i for i in range(len(tokenizer)) if "\n\n" in tokenizer.decode([i])]
    eos = [tokenizer.eos_token_id, *blank_line]
    shared = dict(max_new_tokens=96, repetition_penalty=1.2, eos_token_id=eos)
    constant, adaptive = dict(assistant_model=pair.draft, num_assistant_tokens=4), dict(assistant_model=pair.draft)
    return QueueCase(pair.target, prompts, shared, constant, adaptive, tokenizer.pad_token_id, eos)


def _stdlib_functions(count: int) -> list[str]:
    """Sources of standard-library functions of 6-40 lines, in a fixed order."""
    import calendar
    import difflib
    import fnmatch
    import json.decoder
    import shlex
    import string

    sources = []
    for module in (textwrap, shlex, string, json.decoder, statistics, inspect, difflib, fnmatch, calendar, random):
        for _, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ != module.__name__:
                continue
            source = textwrap.dedent(inspect.getsource(function))
            if 6 <= source.count("\n") <= 40:
                sources.append(source)
            if len(sources) == count:
                return sources
    return sources


def smollm2(dtype: torch.dtype, count: int) -> QueueCase:
    """SmolLM2 with prompt lookup (10 tokens), asked about `count` stdlib functions, two questions alternating: a
    rewrite with type hints (the answer copies the function: long) and what it returns (one sentence: short)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = ensure_real_model("smollm2-135m-instruct")
    target = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    questions = (
        "Rewrite this Python function with type hints, keeping its body as it is:",
        "In one sentence, what does this Python function return?",
    )
    prompts = []
    for i, source in enumerate(_stdlib_functions(count)):
        message = f"{questions[i % 2]}\n\n```python\n{source}```"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids)
    eos = target.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])
    lookup = dict(prompt_lookup_num_tokens=10)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    shared = dict(max_new_tokens=128, eos_token_id=eos)
    return QueueCase(target, prompts, shared, dict(lookup, schedule="constant"), dict(lookup, schedule="adaptive"),
                     pad_id, eos)  # fmt: skip


PAIRS = {"demo": demo, "smollm2-lookup": smollm2}


def _until_eos(tokens: list[int], eos: list[int]) -> list[int]:
    """A row of transformers' batched output: its tokens up to and including its first EOS (then padding)."""
    end = next((i + 1 for i, token in enumerate(tokens) if token in eos), len(tokens))
    return tokens[:end]


def _summary(began: float, tokens: list[list[int]], latency: list[float], service: list[float], stats) -> dict:
    total = time.perf_counter() - began
    ordered = sorted(latency)
    drafted = sum(s.drafted for s in stats)
    return {
        "total_s": total,
        "new_tokens": sum(len(t) for t in tokens),
        "tokens_per_s": sum(len(t) for t in tokens) / total,
        "latency_mean_s": statistics.mean(latency),
        "latency_p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "in_slot_mean_s": statistics.mean(service),
        "acceptance_rate": sum(s.accepted for s in stats) / drafted if drafted else None,
        "target_passes": sum(s.target_forwards for s in stats),
        "tokens": tokens,
    }


def run_queue(method: str, case: QueueCase, slots: int, prompts: list[list[int]], limit: int | None = None) -> dict:
    """The whole queue through `slots` refilled slots (`generate_queue`)."""
    shared = dict(case.shared, max_new_tokens=limit or case.shared["max_new_tokens"])
    began = time.perf_counter()
    result = generate_queue(case.target, prompts, slots=slots, pad_token_id=case.pad_id, **shared,
                            **case.drafting(method))  # fmt: skip
    rows = result.stats.rows
    return _summary(began, [t.tolist() for t in result.tokens], [r.finished_s for r in rows],
                    [r.finished_s - r.joined_s for r in rows], [result.stats])  # fmt: skip


def run_fixed(method: str, case: QueueCase, slots: int, prompts: list[list[int]], limit: int | None = None) -> dict:
    """Today's fixed batches: `generate` (or transformers' `model.generate`) on consecutive groups of `slots`."""
    shared = dict(case.shared, max_new_tokens=limit or case.shared["max_new_tokens"])
    began = time.perf_counter()
    tokens, latency, service, stats = [], [], [], []
    for first in range(0, len(prompts), slots):
        ids, mask = left_padded([torch.tensor(p) for p in prompts[first : first + slots]], case.pad_id)
        offset = time.perf_counter() - began
        if method == "transformers":
            with torch.inference_mode():
                out = case.target.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=case.pad_id,
                                           **shared)  # fmt: skip
            done = time.perf_counter() - began
            tokens += [_until_eos(row[ids.shape[1] :].tolist(), case.eos) for row in out]
            latency += [done] * ids.shape[0]
            service += [done - offset] * ids.shape[0]
            continue
        result = generate(case.target, ids, attention_mask=mask, pad_token_id=case.pad_id, **shared,
                          **case.drafting(method))  # fmt: skip
        for b, row in enumerate(result.stats.rows):
            tokens.append(result.sequences[b, ids.shape[1] : ids.shape[1] + row.new_tokens].tolist())
            latency.append(offset + row.finished_s)
            service.append(row.finished_s)
        stats.append(result.stats)
    return _summary(began, tokens, latency, service, stats)


def run_method(method: str, case: QueueCase, slots: int, prompts: list[list[int]], limit: int | None = None) -> dict:
    runner = run_queue if method in QUEUED else run_fixed
    return runner(method, case, slots, prompts, limit)


def median_summary(runs: list[dict], reference: list[list[int]]) -> dict:
    """Medians over repeats; `same_as_plain`: the share of prompts whose tokens equal the plain queue's."""
    keys = [key for key in runs[0] if key != "tokens"]
    summary = {
        key: statistics.median(values) if (values := [r[key] for r in runs if r.get(key) is not None]) else None
        for key in keys
    }
    tokens = runs[-1]["tokens"]
    summary["same_as_plain"] = sum(a == b for a, b in zip(tokens, reference)) / len(reference)
    return summary


def ratios(summary: dict) -> dict:
    """Throughput ratios in one run: assisted / plain (queue) and refill / fixed (per method)."""
    rate = {method: values["tokens_per_s"] for method, values in summary.items()}
    out = {f"{m}_vs_plain": rate[m] / rate["plain"] for m in ("adaptive", "constant") if m in rate and "plain" in rate}
    both = [m for m in QUEUED if {m, f"fixed_{m}"} <= rate.keys()]
    out.update({f"refill_vs_fixed_{m}": rate[m] / rate[f"fixed_{m}"] for m in both})
    if "transformers" in rate:
        out.update({f"{m}_vs_transformers": rate[m] / rate["transformers"] for m in QUEUED if m in rate})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", choices=tuple(PAIRS), default=list(PAIRS))
    parser.add_argument("--slots", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--prompts", type=int, default=64, help="prompts in the queue")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="default: every usable core")
    parser.add_argument("--out", type=Path, default=RESULTS / "queue.json")
    args = parser.parse_args()
    if "plain" not in args.methods:
        args.methods.insert(0, "plain")  # every ratio is taken against it
    threads = set_threads(args.threads)
    results = []
    for pair_name in args.pairs:
        for dtype_name in args.dtypes:
            case = PAIRS[pair_name](DTYPES[dtype_name], args.prompts)
            lengths = [len(p) for p in case.prompts]
            for slots in args.slots:
                for method in args.methods:  # warm-up: first-call costs stay out
                    run_method(method, case, slots, case.prompts[: min(slots + 1, len(case.prompts))], limit=4)
                cases = {m: partial(run_method, m, case, slots, case.prompts) for m in args.methods}
                runs = interleaved(cases, args.repeats, warmup=0, order="rotate").outputs
                reference = runs["plain"][-1]["tokens"]
                summary = {method: median_summary(values, reference) for method, values in runs.items()}
                answer_lengths = [len(t) for t in reference]
                results.append({
                    "pair": pair_name, "dtype": dtype_name, "slots": slots, "prompt_lengths": lengths,
                    "answer_lengths": answer_lengths, "methods": summary, "ratios": ratios(summary),
                })  # fmt: skip
                line = "  ".join(f"{m} {summary[m]['tokens_per_s']:.0f} tok/s" for m in args.methods)
                shown = "  ".join(f"{k} {v:.2f}x" for k, v in ratios(summary).items())
                print(f"{pair_name:15s} {dtype_name} B={slots:2d}: {line}\n    {shown}", flush=True)
                payload = {"threads": threads, "prompts": args.prompts, "repeats": args.repeats, "results": results}
                write_result("queue", command_line("queue"), payload, args.out)  # every case: a cut run keeps them


if __name__ == "__main__":
    main()

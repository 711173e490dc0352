"""EAGLE-3 heads on real weights: α, tokens per round E, c and the speed-up against plain decoding, prompt lookup
(this package's and transformers') and the head combined with lookup, on prompts the heads never saw.

    python -m benchmarks.eagle                                   # both targets, fp32, 1 and 2 threads
    python -m benchmarks.eagle --dtypes fp32 int4                # and the quantized path (the .gguf kept int4)
    python -m benchmarks.eagle --targets smollm2-135m-instruct --threads 1 --quick
    python -m benchmarks.eagle --heads smollm2-135m-instruct=/path/to/head
    python -m benchmarks.eagle --widths --targets smollm2-135m-instruct --threads 1   # tree drafting's premise

Heads come from `train-draft` (default location `<cache>/eagle_heads/<target>`, written by the command in
docs/eagle.md: `train-draft <target> --text /usr/lib/python3.11 --extensions .py --chat-share 0.85 --open-share 0.6
... --output <that directory> --minutes 60`): the target's answers to prompts made from the standard library's
source (templated open-ended requests on its prose words, questions about windows of it, raw windows), never
these prompts. Tasks: three open-ended chat prompts (two questions and
a story), and the input-grounded `edit` and `summarize` of `benchmarks.real_models` (where prompt lookup shines).
Greedy, EOS ignored, exactly `--new-tokens` tokens; every method round-robin `--repeats` times after a warm-up,
medians; every output of this package is checked token-identical to its plain decoding (transformers' plain
`generate` is compared too: on the int4 path its attention is not batch-invariant and may round differently).

Reported per case: α and E (tokens per speculative round, the target's own token included) of the best constant-γ
head run, c (one head chain step, its logits over the draft vocabulary mapped onto the target's, / one target
decode step), S_E = E / (γc + 1), and every method's speed-up over transformers' plain `generate` and over this
package's plain decoding. `int4` is the quantized CPU path (`AssistedGenerator` on the model's `.gguf`, its
blocks repacked for PyTorch's int4 kernels, batch-invariant attention): the fastest precision here.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from assisted_backends import AssistedGenerator, generate
from assisted_backends.drafters.eagle import load_head
from assisted_backends.drafters.eagle.build import prepared_head
from assisted_backends.drafters.eagle.cache import HeadCache
from assisted_backends.loading.files import cache_root
from assisted_backends.loading.models import load_tokenizer
from assisted_backends.model_facts import ModelFacts
from benchmarks.harness import (
    RESULTS,
    command_line,
    ensure_real_gguf,
    interleaved,
    measured_limit,
    step_seconds,
    write_result,
)
from benchmarks.real_models import DTYPES, LOOKUP_TOKENS, TASKS, load, prompt_ids

OPEN_TASKS = {
    "chat_focus": "What are three practical tips for staying focused while studying? Explain each briefly.",
    "chat_sky": "Explain to a ten-year-old why the sky is blue and why sunsets are red.",
    "story": TASKS["open"],
}
ALL_TASKS = {**OPEN_TASKS, "edit": TASKS["edit"], "summarize": TASKS["summarize"]}
TARGETS = ("smollm2-135m-instruct", "gemma-3-270m")
PRECISIONS = (*DTYPES, "int4")
_QUANTIZED: dict[str, torch.nn.Module] = {}


def load_target(name: str, precision: str) -> tuple[torch.nn.Module, object]:
    """(the target, its tokenizer) with EOS ignored. `int4`: the `.gguf` loaded by `AssistedGenerator` with its
    quantization kept (cached across cases)."""
    if precision != "int4":
        return load(name, DTYPES[precision])
    if name not in _QUANTIZED:
        model = AssistedGenerator(str(ensure_real_gguf(name)), device="cpu").model
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        _QUANTIZED[name] = model
    return _QUANTIZED[name], load_tokenizer(str(ensure_real_gguf(name)))


def default_head_dir(target: str) -> Path:
    return cache_root() / "eagle_heads" / target


def head_step_seconds(head, target, prompt: torch.Tensor, repeats: int = 15) -> float:
    """Median seconds of one chain step of the head after `prompt`: its layer on one column of a warm cache,
    its logits over the draft vocabulary carried onto the target's, and the argmax."""
    prepared = prepared_head(head, target)
    config = prepared.config
    length = prompt.shape[1]
    dtype, device = prepared.compute_dtype, prepared.compute_device
    cache = HeadCache(1, config.num_key_value_heads, config.attention_head_dim, length + 8,
                      torch.zeros(1, dtype=torch.long), False, dtype, device)  # fmt: skip
    cache.length = length
    vocab = ModelFacts.of(target).vocab_size
    token, hidden = prompt[:, -1:], torch.randn(1, 1, config.hidden_size, dtype=dtype)
    position = torch.tensor([[length]])

    def step() -> None:
        with torch.inference_mode():
            out = prepared(token, hidden, position, cache.attend_at(length))
            prepared.target_logits(prepared.draft_logits(out), vocab).argmax(-1)

    return interleaved({"step": step}, repeats, warmup=2).median("step")


def tokens_of(output) -> list[int]:
    if hasattr(output, "sequences"):
        return output.sequences[0, output.sequences.shape[1] - output.stats.new_tokens :].tolist()
    return list(output)


def measure(target_name: str, head_dir: Path, dtype: str, threads: int, task: str, args) -> dict:
    torch.set_num_threads(threads)
    target, tokenizer = load_target(target_name, dtype)
    head = load_head(head_dir)
    prompt = prompt_ids(tokenizer, task) if task not in OPEN_TASKS else _chat(tokenizer, OPEN_TASKS[task])
    new = args.new_tokens
    common = dict(max_new_tokens=new, eos_token_id=[], device="cpu")

    def hf(**extra) -> Callable[[], list[int]]:
        def run() -> list[int]:
            with torch.inference_mode():
                out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                      do_sample=False, **extra)  # fmt: skip
            return out[0, prompt.shape[1] :].tolist()

        return run

    def ours(**extra) -> Callable[[], object]:
        return lambda: generate(target, prompt, **common, **extra)

    cases: dict[str, Callable[[], object]] = {
        "hf_plain": hf(),
        "ours_plain": ours(),
        "hf_lookup": hf(prompt_lookup_num_tokens=LOOKUP_TOKENS),
        "ours_lookup": ours(prompt_lookup_num_tokens=LOOKUP_TOKENS),
        "eagle_adaptive": ours(assistant_model=head),
    }
    for gamma in args.gammas:
        cases[f"eagle_constant_{gamma}"] = ours(assistant_model=head, num_assistant_tokens=gamma)
    cases["eagle+lookup"] = ours(assistant_model=head, prompt_lookup_num_tokens=LOOKUP_TOKENS)  # adaptive γ
    outputs = {name: run() for name, run in cases.items()}  # warm-up, and the identity check
    reference = tokens_of(outputs["ours_plain"])  # the package's plain decoding: on the int4 path, transformers'
    identical = {name: tokens_of(out) == reference for name, out in outputs.items()}  # own loop rounds otherwise
    timings = interleaved(cases, args.repeats, warmup=0)
    median = timings.medians()
    base = median["hf_plain"]
    t_target = step_seconds(target, prompt, 1, repeats=9)
    c = head_step_seconds(head, target, prompt) / t_target
    constant = [name for name in cases if name.startswith("eagle_constant_")]
    best = min(constant, key=median.__getitem__)
    gamma = int(best.rsplit("_", 1)[1])
    stats = timings.last(best).stats
    per_round = stats.tokens_per_speculative_round or 1.0
    speedups = {n: round(base / v, 3) for n, v in median.items()}
    return {
        "target": target_name,
        "head": str(head_dir),
        "task": task,
        "open_ended": task in OPEN_TASKS,
        "dtype": dtype,
        "threads": threads,
        "prompt_tokens": int(prompt.shape[1]),
        "new_tokens": new,
        "median_s": {n: round(v, 4) for n, v in median.items()},
        "spread_s": {n: [round(low, 4), round(high, 4)] for n, (low, high) in timings.spread().items()},
        "speedup_vs_hf_plain": speedups,
        "speedup_vs_ours_plain": {n: round(median["ours_plain"] / v, 3) for n, v in median.items()},
        "identical_to_ours_plain": identical,
        "best_constant": best,
        "gamma": gamma,
        "alpha": round(stats.acceptance_rate or 0.0, 3),
        "tokens_per_round_E": round(per_round, 3),
        "c": round(c, 4),
        "t_target_step_ms": round(1000 * t_target, 2),
        "S_E": round(measured_limit(per_round, gamma, c), 3),
        "head_vs_lookup": round(median["ours_lookup"] / median[best], 3),
        "combined_vs_lookup": round(median["ours_lookup"] / median["eagle+lookup"], 3),
        "adaptive_alpha": round(timings.last("eagle_adaptive").stats.acceptance_rate or 0.0, 3),
    }


def verify_widths(
    target_name: str, dtype: str, threads: int, widths=(1, 3, 5, 8, 12, 16, 26), repeats: int = 9
) -> dict:
    """One target pass over w tokens on a warm cache of 160 positions, in decode steps: a tree of w nodes pays
    only if its tokens per round exceed the chain's by the ratio of these costs (EAGLE-2's premise: a wide verify
    pass about as cheap as a narrow one)."""
    from benchmarks.harness import random_context

    torch.set_num_threads(threads)
    target, _ = load_target(target_name, dtype)
    context = random_context(ModelFacts.of(target).vocab_size, 160, seed=0)
    seconds = {w: step_seconds(target, context, w, repeats=repeats, warmup=2) for w in widths}
    return {"target": target_name, "dtype": dtype, "threads": threads,
            "ms": {w: round(1000 * t, 2) for w, t in seconds.items()},
            "decode_steps": {w: round(t / seconds[1], 2) for w, t in seconds.items()}}  # fmt: skip


def _chat(tokenizer, text: str) -> torch.Tensor:
    """A user turn up to the assistant's opener; plain text and a blank line for a base model (no chat template),
    as `train-draft` renders its requests."""
    if getattr(tokenizer, "chat_template", None) is None:
        return tokenizer(f"{text}\n\n", return_tensors="pt")["input_ids"]
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip


def summary_line(r: dict) -> str:
    s = r["speedup_vs_ours_plain"]
    ours = {n: v for n, v in r["identical_to_ours_plain"].items() if not n.startswith("hf_")}
    flag = "" if all(ours.values()) else " | NOT IDENTICAL: " + " ".join(n for n, v in ours.items() if not v)
    return (
        f"{r['target']:<22} {r['task']:<10} {r['dtype']} {r['threads']}t"
        f" | {r['best_constant']} {s[r['best_constant']]:.2f}x"
        f" | adaptive {s['eagle_adaptive']:.2f}x | +lookup {s['eagle+lookup']:.2f}x | lookup {s['ours_lookup']:.2f}x"
        f" (HF {s['hf_lookup']:.2f}x, HF plain {s['hf_plain']:.2f}x) vs our plain"
        f" | α {r['alpha']:.2f} E {r['tokens_per_round_E']:.2f} c {r['c']:.3f}"
        f" S_E {r['S_E']:.2f}{flag}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--heads", nargs="*", default=[], help="TARGET=DIR (default <cache>/eagle_heads/TARGET)")
    parser.add_argument("--tasks", nargs="+", choices=sorted(ALL_TASKS), default=list(ALL_TASKS))
    parser.add_argument("--dtypes", nargs="+", choices=PRECISIONS, default=["fp32"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gammas", nargs="+", type=int, default=[2, 3, 4])
    parser.add_argument("--quick", action="store_true", help="open-ended tasks, 32 new tokens, 2 repeats, 1 thread")
    parser.add_argument("--widths", action="store_true", help="only the verify pass's cost by width (tree drafting)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.new_tokens, args.repeats, args.threads = list(OPEN_TASKS), 32, 2, [1]
    warnings.filterwarnings("ignore")
    if args.widths:
        rows = [verify_widths(t, d, n) for d in args.dtypes for n in args.threads for t in args.targets]
        for row in rows:
            print(row, flush=True)
        out = Path(args.out) if args.out else RESULTS / "eagle_verify_widths.json"
        write_result(
            out.stem, command_line("eagle"), {"what": verify_widths.__doc__.replace("\n", " "), "results": rows}, out
        )
        return
    heads = {t: default_head_dir(t) for t in args.targets} | dict(h.split("=", 1) for h in args.heads)
    missing = [f"{t}: {heads[t]}" for t in args.targets if not Path(heads[t]).is_dir()]
    if missing:
        sys.exit("no head for " + "; ".join(missing) + ". Train one (docs/eagle.md): train-draft TARGET --text "
                 "/usr/lib/python3.11 --extensions .py --output DIR --minutes 60")  # fmt: skip
    out = Path(args.out) if args.out else RESULTS / ("eagle_quick.json" if args.quick else "eagle.json")
    results = []
    for dtype in args.dtypes:
        for threads in args.threads:
            for target in args.targets:
                for task in args.tasks:
                    print(
                        f"measuring {target} / {task} / {dtype} / {threads} thread(s) ...", file=sys.stderr, flush=True
                    )
                    results.append(measure(target, Path(heads[target]), dtype, threads, task, args))
                    print(summary_line(results[-1]), flush=True)
                    payload = {"what": __doc__.split("\n\n")[2].replace("\n", " "), "results": results}
                    write_result(out.stem, command_line("eagle"), payload, out)


if __name__ == "__main__":
    main()

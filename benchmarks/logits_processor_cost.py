"""What a logits processor costs the native decoder step: a real `.gguf` model's greedy tokens/s with and without
`min_new_tokens`, `repetition_penalty` and OpenAI's presence / frequency penalties (issue 51: at most 5% of a step).

    python -m benchmarks.logits_processor_cost [--model smollm2-135m-instruct] [--new 48] [--repeats 5]
                                               [--lookup 0 10] [--threads 1] [--before] [--output NAME]

Each case is one `generate` call on the native step (prefix cache off) after a fixed prompt: `none`, `min_new_tokens`
(= --new: EOS masked at every step), `min_new_tokens_met` (= 1: nothing to do after the first token), `repetition`
(1.1), `presence_frequency` (0.5, 0.5). `--lookup 0 10`: plain decoding (one position a step) and prompt lookup
(up to 11 verified positions a round). `--before` also times every case on the paths it replaced (`NAME/before`:
each processor called once per verified position, `engine.position_processors` bypassed, and torch's own argmax in
place of `sampling.greedy_tokens`), in the same interleaved rounds. Printed per case: median tokens/s, min-max, cost
= tokens/s(none) / tokens/s(case) − 1 (`none` on the same path), and the time spent turning logits into scores
(`TokenSelector.scores`, where every processor runs) per token and, less `none`'s, as a share of `none`'s whole
time, and as a share of the case's own time (with prompt lookup a penalty changes the text, so the number of rounds
per token too): the processors' own cost, readable where a shared machine makes the tokens/s noisy. A processor
that changes no token (min_new_tokens without an EOS in reach) is checked to give `none`'s tokens; every case gives
the same tokens on both paths.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator

import torch

from benchmarks.harness import command_line, ensure_real_gguf, interleaved, write_result

PROMPT = 48


@contextlib.contextmanager
def _timed_scores(spent: list[float]) -> Iterator[None]:
    """Within the block the seconds spent in `TokenSelector.scores` (the processors' whole cost) add up in `spent`."""
    from assisted_backends.engine.sampling import TokenSelector

    scores = TokenSelector.scores

    def timed(self, *arguments, **keywords):
        began = time.perf_counter()
        try:
            return scores(self, *arguments, **keywords)
        finally:
            spent[0] += time.perf_counter() - began

    TokenSelector.scores = timed
    try:
        yield
    finally:
        TokenSelector.scores = scores


@contextlib.contextmanager
def _before() -> Iterator[None]:
    """Within the block the paths before issue 51: every processor once per verified position, torch's own argmax."""
    from assisted_backends.engine import position_processors, round

    known, greedy = position_processors._at_once, round.greedy_tokens
    position_processors._at_once = lambda processor: None
    round.greedy_tokens = lambda scores: scores.argmax(dim=-1)
    try:
        yield
    finally:
        position_processors._at_once, round.greedy_tokens = known, greedy


def _cases(new: int) -> dict[str, Callable[[], dict]]:
    """{case: the generate arguments it adds}."""
    from transformers.generation.logits_process import LogitsProcessorList

    from assisted_backends.options.penalties import OpenAIPenaltiesLogitsProcessor

    return {
        "none": lambda: {},
        "min_new_tokens": lambda: {"min_new_tokens": new},
        "min_new_tokens_met": lambda: {"min_new_tokens": 1},
        "repetition": lambda: {"repetition_penalty": 1.1},
        "presence_frequency": lambda: {
            "logits_processor": LogitsProcessorList([OpenAIPenaltiesLogitsProcessor(0.5, 0.5, PROMPT)])
        },
    }


def _cpu_model() -> str:
    lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "unknown")


def measure(native, new: int, lookup: int, repeats: int, before: bool) -> dict:
    """Interleaved medians for one decoding mode (`lookup` 0: plain)."""
    from assisted_backends.api.generation import AssistedGenerator

    generator = AssistedGenerator(native, prefix_cache=False)
    vocab = native.config.vocab_size
    prompt = (torch.arange(PROMPT) * 7919 % min(vocab - 200, 20000) + 100)[None]
    extra = {"max_new_tokens": new, "do_sample": False, "pad_token_id": 0}
    if lookup:
        extra["prompt_lookup_num_tokens"] = lookup

    def run(arguments: Callable[[], dict], before: bool) -> Callable[[], tuple[torch.Tensor, float]]:
        def call() -> tuple[torch.Tensor, float]:
            spent = [0.0]
            with _before() if before else contextlib.nullcontext(), _timed_scores(spent):
                return generator.generate(prompt, **extra, **arguments()).sequences[0, PROMPT:], spent[0]

        return call

    cases = {}
    for name, arguments in _cases(new).items():
        cases[name] = run(arguments, before=False)
        if before:
            cases[f"{name}/before"] = run(arguments, before=True)
    timings = interleaved(cases, repeats, warmup=1)
    rows = {}
    for name in cases:
        none = "none" + name[len(name.split("/")[0]) :]  # the same path without a processor
        none_rate = len(timings.last(none)[0]) / timings.median(none)
        none_scores = statistics.median(spent for _, spent in timings.outputs[none])
        tokens = timings.last(name)[0]
        rate = len(tokens) / timings.median(name)
        low, high = timings.spread()[name]
        scores = statistics.median(spent for _, spent in timings.outputs[name])
        rows[name] = {"tokens": len(tokens), "tokens_per_s": round(rate, 2), "min_max_tokens_per_s":
                      [round(len(tokens) / high, 2), round(len(tokens) / low, 2)],
                      "cost": round(none_rate / rate - 1, 4),
                      "scores_ms_per_token": round(1e3 * scores / len(tokens), 4),
                      "scores_cost_of_step": round((scores - none_scores) / timings.median(none), 4),
                      "scores_share_of_own_time": round(scores / timings.median(name), 4)}  # fmt: skip
        base = name.split("/")[0]
        if base != name:  # the same processor on both paths: the same tokens
            assert torch.equal(tokens, timings.last(base)[0]), f"{name}: tokens differ from the new paths'"
    same = torch.equal(timings.last("min_new_tokens")[0], timings.last("none")[0])
    rows["min_new_tokens"]["same_tokens_as_none"] = same
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="smollm2-135m-instruct or gemma-3-270m")
    parser.add_argument("--new", type=int, default=48, help="new tokens per call (default 48)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lookup", type=int, nargs="+", default=[0], help="prompt lookup sizes (0: plain)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--before", action="store_true", help="also time the paths before issue 51")
    parser.add_argument("--output", default=None, help="write benchmarks/results/NAME.json")
    arguments = parser.parse_args(argv)

    from assisted_backends.backends.cpu import invariant_attention
    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized.model import load_gguf_quantized

    torch.set_num_threads(arguments.threads)
    reference = load_gguf_quantized(ensure_real_gguf(arguments.model), tokenizer=False).reference
    invariant_attention.enable(reference)
    native = NativeCausalLM(reference)
    cpu = _cpu_model()
    print(f"{arguments.model} (vocab {native.config.vocab_size}), {arguments.threads} thread(s), {cpu}, "
          f"{arguments.new} new tokens after {PROMPT}, median of {arguments.repeats} interleaved")  # fmt: skip
    results = {}
    for lookup in arguments.lookup:
        mode = f"prompt_lookup_{lookup}" if lookup else "plain"
        rows = measure(native, arguments.new, lookup, arguments.repeats, arguments.before)
        results[mode] = rows
        print(f"-- {mode}")
        for name, row in rows.items():
            low, high = row["min_max_tokens_per_s"]
            print(
                f"{name:34s} {row['tokens_per_s']:8.1f} tok/s ({low:.1f}-{high:.1f})  cost {row['cost']:+6.1%}  "
                f"scores {row['scores_ms_per_token']:.3f} ms/token: {row['scores_cost_of_step']:+.2%} of none's time, "
                f"{row['scores_share_of_own_time']:.2%} of its own"
            )
    payload = {"model": arguments.model, "threads": arguments.threads, "cpu_model": cpu, "new_tokens": arguments.new,
               "prompt_tokens": PROMPT, "repeats": arguments.repeats, "results": results}  # fmt: skip
    if arguments.output:
        write_result(arguments.output, command_line("logits_processor_cost"), payload)
    return payload


if __name__ == "__main__":
    main()

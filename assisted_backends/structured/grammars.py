"""Grammars compiled for one tokenizer by llguidance (the optional `structured` extra, imported on first use).

A `Grammar` is immutable and shared: the tokenizer's lexicon (built once per tokenizer and EOS set, about a
second for a 49k vocabulary, then cached) and the grammar text llguidance checked against it. Each sequence
decoded under it gets its own matcher (`Grammar.matcher`); `structured.processor` keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from assisted_backends.extras import install_hint

JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: no run of spaces or newlines for a model to loop on
_LEXICONS: dict[tuple[int, tuple[int, ...], int], tuple[Any, Any]] = {}  # (id, eos, vocab) -> (tokenizer, lexicon)
_MAX_LEXICONS = 8


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
    except ImportError:
        raise ImportError(
            f"structured output (response_format, json_schema, regex, lark) needs llguidance: "
            f"{install_hint('structured')}"
        ) from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A grammar checked against a tokenizer's lexicon: `vocab_size` tokens, `eos_ids` allowed only once the
    grammar is complete."""

    lexicon: Any
    text: str
    vocab_size: int
    eos_ids: tuple[int, ...]

    def matcher(self) -> Any:
        """A new llguidance matcher at the start of the grammar."""
        return _llguidance().LLMatcher(self.lexicon, self.text, log_level=0)


def _eos_ids(tokenizer: Any, eos_token_id: int | Sequence[int] | None) -> tuple[int, ...]:
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise ValueError("eos_token_id: the tokenizer has no EOS token; pass the model's EOS id(s) as eos_token_id")
    return tuple(int(e) for e in ([eos] if isinstance(eos, int) else eos))


def _lexicon(tokenizer: Any, eos: tuple[int, ...], vocab_size: int) -> Any:
    key = (id(tokenizer), eos, vocab_size)
    if key not in _LEXICONS:
        if len(_LEXICONS) >= _MAX_LEXICONS:
            _LEXICONS.pop(next(iter(_LEXICONS)))
        lexicon = _llguidance().hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos))
        _LEXICONS[key] = (tokenizer, lexicon)  # the tokenizer is kept so that its id is not reused
    return _LEXICONS[key][1]


def compile_grammar(
    text: str, tokenizer: Any, eos_token_id: int | Sequence[int] | None = None, vocab_size: int | None = None
) -> Grammar:
    """`text` (llguidance's grammar: from `LLMatcher.grammar_from_*`) for `tokenizer` (a fast Hugging Face
    tokenizer); `eos_token_id`: the model's EOS id(s) (default: the tokenizer's); `vocab_size`: the model's logits
    width when it differs from the tokenizer's length. A grammar llguidance refuses raises ValueError."""
    llguidance = _llguidance()
    eos = _eos_ids(tokenizer, eos_token_id)
    lexicon = _lexicon(tokenizer, eos, int(vocab_size or len(tokenizer)))
    error = llguidance.LLMatcher.validate_grammar(text, lexicon)
    if error:
        raise ValueError(f"the grammar cannot be used: {error}")
    return Grammar(lexicon, text, int(vocab_size or len(tokenizer)), eos)


def json_schema_grammar(schema: dict | str, tokenizer: Any, **options: Any) -> Grammar:
    """JSON text valid under `schema` (a JSON Schema, as a dict or its JSON text)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"schema: not valid JSON ({error}); pass a JSON Schema object") from None
    if not isinstance(schema, dict):
        raise ValueError(f"schema: a JSON Schema is an object, got {type(schema).__name__}")
    text = _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    return compile_grammar(text, tokenizer, **options)


def regex_grammar(pattern: str, tokenizer: Any, **options: Any) -> Grammar:
    """Text matching the regular expression `pattern` whole."""
    return compile_grammar(_llguidance().LLMatcher.grammar_from_regex(pattern), tokenizer, **options)


def lark_grammar(grammar: str, tokenizer: Any, **options: Any) -> Grammar:
    """Text of the Lark grammar `grammar` (llguidance's dialect: `start` is the first rule)."""
    return compile_grammar(_llguidance().LLMatcher.grammar_from_lark(grammar), tokenizer, **options)

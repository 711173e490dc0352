"""`POST /tokenize` and `POST /detokenize`, in the shapes llama-server and vLLM serve them.

`/tokenize` takes the text as `content` (llama-server; `add_special`, default false) or `prompt` (vLLM;
`add_special_tokens`, default true) and answers `{"tokens", "count", "max_model_len"}`; `/detokenize` takes
`tokens` and answers the text as `content` (llama-server's name) and `prompt` (vLLM's). `model` may be sent
(vLLM's clients do): it must name the served model. Any other field is refused as unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from assisted_backends.serve.errors import APIError, invalid
from assisted_backends.serve.schemas import boolean_field, kind_of, shown

TOKENIZE_FIELDS = frozenset({"model", "content", "prompt", "add_special", "add_special_tokens"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


@dataclass(frozen=True)
class TokenizeRequest:
    """The text to tokenize and whether the tokenizer adds its special tokens (BOS and the like)."""

    text: str
    add_special: bool


def _known(body: dict[str, Any], fields: frozenset[str], model: str) -> None:
    for name in body:
        if name not in fields:
            field = shown(name)
            raise APIError(400, f"unrecognized request argument supplied: {field}; remove it", field,
                           "unknown_parameter")  # fmt: skip
    if "model" in body and body["model"] != model:
        raise APIError(404, f"model: {shown(body['model'])!r} is not served here; this server serves {model!r}",
                       "model", "model_not_found")  # fmt: skip


def tokenize_request(body: dict[str, Any], model: str) -> TokenizeRequest:
    """A `/tokenize` body, checked: exactly one of `content` (llama-server) and `prompt` (vLLM)."""
    _known(body, TOKENIZE_FIELDS, model)
    given = [name for name in ("content", "prompt") if name in body]
    if len(given) != 1:
        raise invalid("content", "send the text as one of content (llama-server) or prompt (vLLM)",
                      "missing_required_parameter" if not given else "invalid_value")  # fmt: skip
    name = given[0]
    text = body[name]
    if not isinstance(text, str):
        raise invalid(name, f"expected a string, got {kind_of(text)}", "invalid_type")
    if "add_special" in body and "add_special_tokens" in body:
        raise invalid("add_special", "send one of add_special and add_special_tokens")
    if "add_special" in body:
        add = boolean_field(body, "add_special")
    elif "add_special_tokens" in body:
        add = boolean_field(body, "add_special_tokens")
    else:
        add = name == "prompt"  # each server's default
    return TokenizeRequest(text, add)


def detokenize_request(body: dict[str, Any], model: str, vocab_size: int) -> list[int]:
    """A `/detokenize` body's `tokens`, checked against the vocabulary."""
    _known(body, DETOKENIZE_FIELDS, model)
    tokens = body.get("tokens")
    if tokens is None:
        raise invalid("tokens", "required: an array of token ids", "missing_required_parameter")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise invalid("tokens", f"expected an array of token ids, got {kind_of(tokens)}", "invalid_type")
    outside = [t for t in tokens if not 0 <= t < vocab_size]
    if outside:
        raise invalid("tokens", f"token id {outside[0]} is outside the vocabulary [0, {vocab_size})")
    return tokens

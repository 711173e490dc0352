"""Argument checks `generate(...)` runs first, so bad input fails with one line naming the argument.

Without them a float `max_new_tokens` would be truncated silently (5.5 -> 5), a token id past the
vocabulary would surface as an IndexError deep inside the embedding, and a float seed would reach
the random generator. Integral floats (5.0) are refused too: the fix (`int(...)`) is the caller's.
"""

from __future__ import annotations

import numbers

import torch
from transformers import PreTrainedModel


def check_integer(name: str, value, minimum: int | None = None) -> None:
    """TypeError unless `value` is None or an integer (not a bool); ValueError below `minimum`."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}; pass {name}=int(...)")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def input_vocabulary(model: PreTrainedModel) -> int | None:
    """Rows of the model's input embedding (the ids it can look up), or None when it cannot be told."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if isinstance(rows, int):
        return rows
    weight = getattr(embeddings, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0])
    return getattr(getattr(model, "config", None), "vocab_size", None)


def check_token_ids(model: PreTrainedModel, input_ids) -> None:
    """TypeError for non-integer ids; ValueError naming the first id outside [0, vocabulary)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.numel() == 0:
        return  # the prompt checks (core.generation_options) name those errors
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids (torch.long), got {input_ids.dtype}")
    vocabulary = input_vocabulary(model)
    if vocabulary is None:
        return
    low, high = (int(v) for v in torch.stack([input_ids.min(), input_ids.max()]).tolist())
    if low >= 0 and high < vocabulary:
        return
    bad = ((input_ids < 0) | (input_ids >= vocabulary)).flatten().nonzero()[0, 0].item()
    token = int(input_ids.flatten()[bad])
    raise ValueError(
        f"input_ids holds token id {token} (at flat position {bad}), outside the target's vocabulary "
        f"[0, {vocabulary}); encode the prompt with the target model's own tokenizer"
    )


def check_call(model: PreTrainedModel, input_ids, max_new_tokens, seed, num_assistant_tokens) -> tuple:
    """The checks `generate` runs before anything else; returns (max_new_tokens, seed,
    num_assistant_tokens) as Python ints (numpy integers accepted) or None."""
    check_integer("max_new_tokens", max_new_tokens, minimum=1)
    check_integer("seed", seed)
    check_integer("num_assistant_tokens", num_assistant_tokens, minimum=1)
    check_token_ids(model, input_ids)
    return tuple(None if value is None else int(value) for value in (max_new_tokens, seed, num_assistant_tokens))


def drafting_tokenizer(model, assistant_model, tokenizer, assistant_tokenizer, vocab_size):
    """The `tokenizer=` drafting should see: transformers takes `tokenizer=` for stop strings as well as
    for a draft with another vocabulary, so alone with a same-vocabulary draft (or none) it is not a
    request to translate."""
    if tokenizer is None or assistant_tokenizer is not None:
        return tokenizer
    if assistant_model is None or vocab_size(assistant_model) == vocab_size(model):
        return None
    return tokenizer

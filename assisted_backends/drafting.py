"""Which drafter a `generate` call gets, from the arguments the user passed.

- `assistant_model` sharing the target's vocabulary: `ModelDrafter` (a small LM with its own cache).
- `assistant_model` with another tokenizer (`tokenizer=` and `assistant_tokenizer=` given): planned.
- `prompt_lookup_num_tokens`: n-gram lookup in the context, no draft model: planned.
- `assistant_early_exit=N`: the target's first N layers and its own head as the draft: planned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel

from assisted_backends.core.drafters import Drafter, ModelDrafter
from assisted_backends.core.runner import ModelRunner

RunnerFactory = Callable[[PreTrainedModel], ModelRunner]


@dataclass(frozen=True)
class DraftSpec:
    """Everything the user said about drafting."""

    assistant_model: PreTrainedModel | None = None
    tokenizer: Any = None
    assistant_tokenizer: Any = None
    prompt_lookup_num_tokens: int | None = None
    assistant_early_exit: int | None = None

    @property
    def speculates(self) -> bool:
        return any(
            value is not None
            for value in (self.assistant_model, self.prompt_lookup_num_tokens, self.assistant_early_exit)
        )


def vocab_size(model: PreTrainedModel) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def validate(spec: DraftSpec, target: PreTrainedModel) -> None:
    """Reject combinations that cannot work, before any model is moved or run."""
    chosen = [
        name
        for name, value in (
            ("assistant_model", spec.assistant_model),
            ("prompt_lookup_num_tokens", spec.prompt_lookup_num_tokens),
            ("assistant_early_exit", spec.assistant_early_exit),
        )
        if value is not None
    ]
    if len(chosen) > 1:
        raise ValueError(f"choose one way of drafting, got {' and '.join(chosen)}")
    if (spec.tokenizer is None) != (spec.assistant_tokenizer is None):
        raise ValueError("pass both tokenizer= (the target's) and assistant_tokenizer= (the draft's), or neither")
    if spec.assistant_model is not None and spec.tokenizer is None:
        draft_vocab, target_vocab = vocab_size(spec.assistant_model), vocab_size(target)
        if draft_vocab != target_vocab:
            raise ValueError(
                f"assistant_model has a vocabulary of {draft_vocab} tokens and the target {target_vocab}: "
                "pass tokenizer= and assistant_tokenizer= so tokens can be translated, or use a draft "
                "from the target's family"
            )


def build_drafter(
    spec: DraftSpec, target: PreTrainedModel, prepared_draft: PreTrainedModel | None, make_runner: RunnerFactory
) -> Drafter | None:
    """The drafter for `spec` (None: plain decoding). `prepared_draft` is the backend-prepared assistant."""
    if spec.prompt_lookup_num_tokens is not None:
        raise NotImplementedError("prompt_lookup_num_tokens (prompt lookup drafting) is not available yet")
    if spec.assistant_early_exit is not None:
        raise NotImplementedError("assistant_early_exit (self-speculative drafting) is not available yet")
    if prepared_draft is None:
        return None
    if spec.tokenizer is not None:
        raise NotImplementedError(
            "a draft with another tokenizer (tokenizer=, assistant_tokenizer=) is not available yet"
        )
    return ModelDrafter(make_runner(prepared_draft))

"""Which drafter a `generate` call gets, from the arguments the user passed.

- `assistant_model` sharing the target's vocabulary: `ModelDrafter` (a small LM with its own cache).
- `assistant_model` with another vocabulary (`tokenizer=` and `assistant_tokenizer=` given):
  `TranslatingDrafter` (tokens translated through bytes; sampling over the vocabulary intersection).
- `prompt_lookup_num_tokens`: `PromptLookupDrafter` (n-gram lookup in the context, no draft model).
- `assistant_early_exit=N`: the target's first N layers and its own head (`drafters/early_exit.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from assisted_backends.drafters.any_pair.drafter import TranslatingDrafter
from assisted_backends.drafters.any_pair.rowwise import RowwiseDrafter
from assisted_backends.drafters.any_pair.token_bytes import codec_for
from assisted_backends.drafters.base import Drafter, ModelDrafter
from assisted_backends.drafters.early_exit import EarlyExitDrafter, early_exit_view
from assisted_backends.drafters.prompt_lookup import PromptLookupDrafter
from assisted_backends.engine.runner import ModelRunner

RunnerFactory = Callable[..., ModelRunner]  # (model, rows=None): a runner over those batch rows (None: all)


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
    out_features = getattr(head, "out_features", None)  # also right for quantized or prepacked (IPEX) heads
    if isinstance(out_features, int):
        return out_features
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
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
    lookup = spec.prompt_lookup_num_tokens
    if lookup is not None and (isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 1):
        raise ValueError(
            f"prompt_lookup_num_tokens must be an integer >= 1 (tokens proposed per round), got {lookup!r}"
        )
    if (spec.tokenizer is None) != (spec.assistant_tokenizer is None):
        raise ValueError("pass both tokenizer= (the target's) and assistant_tokenizer= (the draft's), or neither")
    if spec.assistant_model is not None and spec.tokenizer is None:
        draft_vocab, target_vocab = vocab_size(spec.assistant_model), vocab_size(target)
        if draft_vocab != target_vocab:
            raise ValueError(
                f"assistant_model has a vocabulary of {draft_vocab} tokens and the target {target_vocab}: "
                "pass tokenizer= (the target's) and assistant_tokenizer= (the draft's) so tokens can be "
                "translated, or use a draft from the target's family"
            )


def draft_length(spec: DraftSpec, num_assistant_tokens: int | None) -> int | None:
    """The γ the user fixed (None: the schedule chooses). With prompt lookup a given
    `num_assistant_tokens` fixes γ at `prompt_lookup_num_tokens` (the lookup's token count, as
    transformers uses it); otherwise the adaptive schedule drives the lookup up to that count."""
    if spec.prompt_lookup_num_tokens is not None and num_assistant_tokens is not None:
        return spec.prompt_lookup_num_tokens
    return num_assistant_tokens


def max_draft_length(spec: DraftSpec) -> int | None:
    """The largest γ the drafter can use (None: the schedule's own default): `prompt_lookup_num_tokens`
    for lookup drafting, also the constant schedule's γ there."""
    return spec.prompt_lookup_num_tokens


def needs_translation(spec: DraftSpec, target: PreTrainedModel) -> bool:
    """True when the draft's tokens must be translated: tokenizers given and vocabularies (or heads) differ."""
    if spec.assistant_model is None or spec.tokenizer is None:
        return False
    sizes = [getattr(t, "__len__", lambda: None)() for t in (spec.tokenizer, spec.assistant_tokenizer)]
    if vocab_size(spec.assistant_model) != vocab_size(target) or sizes[0] != sizes[1]:
        return True  # decided without get_vocab(), which builds a dict of every token (1.4 s for Gemma 3's 262k)
    return spec.tokenizer.get_vocab() != spec.assistant_tokenizer.get_vocab()


def logical_parameter_count(model: torch.nn.Module) -> int:
    """Parameters as the unquantized model has them: nn.Parameters (shared ones once) plus
    in_features × out_features (+ out_features with a bias) for linear layers whose weights are
    packed buffers instead (w8af32's `quantize_dynamic` and int8pack layers, prepacked IPEX layers)."""
    total = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        rows, cols = getattr(module, "out_features", None), getattr(module, "in_features", None)
        if not (isinstance(rows, int) and isinstance(cols, int)):
            continue
        if isinstance(getattr(module, "weight", None), torch.nn.Parameter):
            continue  # counted above
        bias = getattr(module, "bias", None)
        has_bias = (callable(bias) and bias() is not None) or isinstance(bias, torch.Tensor)
        total += rows * cols + (rows if has_bias and not isinstance(bias, torch.nn.Parameter) else 0)
    return total


def parameter_ratio(spec: DraftSpec, target: PreTrainedModel) -> float | None:
    """Draft parameters / target parameters, counted as unquantized (`logical_parameter_count`): the
    schedule's prior for the cost ratio c (0 for prompt lookup; None: no drafter)."""
    if spec.assistant_early_exit is not None:
        depth = target.config.get_text_config().num_hidden_layers
        return spec.assistant_early_exit / depth
    if spec.prompt_lookup_num_tokens is not None:
        return 0.0  # no draft model: a proposal costs a lookup, not a forward pass
    if spec.assistant_model is None:
        return None
    return logical_parameter_count(spec.assistant_model) / logical_parameter_count(target)


def _matrix_size(module: torch.nn.Module | None) -> tuple[int, int]:
    """(id of its weight, its element count) for an embedding or output head, packed (w8af32) or not."""
    if module is None:
        return 0, 0
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return id(weight), weight.numel()
    rows, cols = getattr(module, "out_features", 0), getattr(module, "in_features", 0)
    return id(module), int(rows) * int(cols)


def body_parameter_count(model: PreTrainedModel) -> int:
    """`logical_parameter_count` without the input embeddings and the output head (once if tied): the
    parameters a pass over a prompt runs for every token (its head runs at the last position only)."""
    matrices = dict(_matrix_size(m) for m in (model.get_input_embeddings(), model.get_output_embeddings()))
    return max(logical_parameter_count(model) - sum(matrices.values()), 1)


def prompt_pass_ratio(spec: DraftSpec, target: PreTrainedModel) -> float:
    """The draft's pass over the prompt against the target's, estimated as the ratio of their body
    parameters (`body_parameter_count`): Gemma 3 270M is 62% embeddings, so SmolLM2-135M's prompt pass
    costs about as much as Gemma 3's (1.06), not half. 0 for drafters that read no prompt: prompt lookup,
    and early exit (it copies the target's keys and values)."""
    if spec.assistant_model is None or spec.assistant_early_exit is not None:
        return 0.0
    return body_parameter_count(spec.assistant_model) / body_parameter_count(target)


def build_drafter(
    spec: DraftSpec,
    target: PreTrainedModel,
    prepared_draft: PreTrainedModel | None,
    make_runner: RunnerFactory,
    fixed_draft_length: bool = False,
    batch_size: int = 1,
    *,
    target_runner: ModelRunner,
) -> Drafter | None:
    """The drafter for `spec` (None: plain decoding). `prepared_draft` is the backend-prepared assistant;
    `fixed_draft_length` (static shapes) asks for exactly γ tokens every round. A draft of another
    tokenizer drafts a batch row by row (`drafters.any_pair.rowwise`). `target_runner`: the target's runner, whose
    cache an early-exit draft reads its layers' keys and values from."""
    if spec.prompt_lookup_num_tokens is not None:
        return PromptLookupDrafter(vocab_size(target), fixed_length=fixed_draft_length)
    if spec.assistant_early_exit is not None:
        view = make_runner(early_exit_view(target, spec.assistant_early_exit))
        return EarlyExitDrafter(view, target_runner, spec.assistant_early_exit)
    if prepared_draft is None:
        return None
    if needs_translation(spec, target):
        if fixed_draft_length:
            raise NotImplementedError(
                "static_shapes=True with a draft of another tokenizer is not supported: its re-tokenized proposals "
                "and contexts vary in length; drop static_shapes or use a draft sharing the target's tokenizer"
            )

        def translating(rows: list[int] | None) -> TranslatingDrafter:
            return TranslatingDrafter(
                make_runner(prepared_draft, rows),
                target=codec_for(spec.tokenizer),
                draft=codec_for(spec.assistant_tokenizer),
                target_vocab=vocab_size(target),
                draft_vocab=vocab_size(prepared_draft),
            )

        if batch_size == 1:
            return translating(None)
        return RowwiseDrafter([translating([b]) for b in range(batch_size)], vocab_size(target))
    return ModelDrafter(make_runner(prepared_draft))

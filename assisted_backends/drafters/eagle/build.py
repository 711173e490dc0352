"""Planning and building the EAGLE drafter: the checks a head must pass against its target, the head in the
target's dtype and device, and the hand-over of features from the target's runner.

The head runs at its `precision` setting (`drafters.eagle.precision`): by default in the dtype of the target's
activations (its input embedding's), so features need no cast, or with its linear layers on the package's int8/int4
kernels when the target runs on them; a copy is made once per (precision, dtype, device) and cached. The backend's
draft precision options do not apply to it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from assisted_backends import hf_compat
from assisted_backends.drafters.eagle.copies import float_copy, quantized_copy, step_bytes
from assisted_backends.drafters.eagle.drafter import EagleDrafter
from assisted_backends.drafters.eagle.features import FeatureStore, LayerTap
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.drafters.eagle.precision import HeadPrecision, choose_precision, warn_if_fell_back
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.model_facts import ModelFacts, quantized_kernels
from assisted_backends.options.errors import OptionError

_PREPARED: weakref.WeakKeyDictionary[Eagle3Head, dict[tuple, Eagle3Head]] = weakref.WeakKeyDictionary()


def is_eagle_head(model: object) -> bool:
    return isinstance(model, Eagle3Head)


def check_head(head: Eagle3Head, target: ModelFacts) -> None:
    """OptionError naming `assistant_model` when `head` was trained for another target (vocabulary, width) or
    borrows an input embedding the target cannot lend (none, or of another width): at planning, from the facts."""
    config = head.config
    problems = []
    if config.vocab_size != target.vocab_size:
        problems.append(f"a vocabulary of {config.vocab_size} tokens (the target's logits have {target.vocab_size})")
    elif int(head.mapped_ids().max()) >= target.vocab_size:
        problems.append("d2t maps draft tokens outside the target's vocabulary")
    width = config.target_hidden_size or config.hidden_size
    if target.hidden_size is not None and width != target.hidden_size:
        problems.append(f"features of width {width} (fc is [{config.hidden_size}, {config.fused_width}]; the target's "
                        f"hidden size is {target.hidden_size})")  # fmt: skip
    if problems:
        raise OptionError(
            "{name} is an EAGLE-3 head trained for another target: "
            + "; ".join(problems)
            + ". Use a head trained for this model (train one with `train-draft`)",
            name="assistant_model",
        )
    if head.embed_tokens is None and target.input_embedding_width is None:
        raise OptionError(
            "{name} carries no embed_tokens and the target's input embedding has no weight to embed tokens with: "
            "use a head that carries embed_tokens",
            name="assistant_model",
        )
    if head.embed_tokens is None and target.input_embedding_width != config.hidden_size:
        raise OptionError(
            f"{{name}} carries no embed_tokens and its width {config.hidden_size} differs from the target "
            f"embedding's {target.input_embedding_width}: it was trained for another target",
            name="assistant_model",
        )


def draft_costs(head: Eagle3Head, target: ModelFacts) -> dict[str, float | None]:
    """The schedule's priors: c ≈ the bytes of weights a head step reads at the precision it will draft in over
    the target's step bytes (both known), else its step parameters over the target's; its prompt pass likewise
    by parameters; α_1 its held-out acceptance when its training run recorded one."""
    step = head.body_parameters()
    costs: dict[str, float | None] = dict(
        cost_ratio=step / target.parameters,
        prompt_pass_ratio=step / target.body_parameters,
        acceptance_prior=head.held_out_alpha,
    )
    if target.weight_bytes:
        choice = choose_precision(head.precision, target.quantized_kernels, head.compute_device)
        head_bytes = head_step_bytes(head, choice, target.activation_dtype or torch.float32)
        costs["cost_ratio"] = head_bytes / target.weight_bytes
    return costs


def head_step_bytes(head: Eagle3Head, choice: HeadPrecision, activation_dtype: torch.dtype) -> int:
    """The weight bytes a draft step of `head` reads at `choice` next to a target whose activations are
    `activation_dtype` (a quantized copy is built once and cached, as drafting will use it)."""
    if choice.quantized:
        return step_bytes(_cached(head, (choice.name,), lambda: quantized_copy(head, choice.name)[0]))
    dtype = torch.bfloat16 if choice.name == "bf16" else activation_dtype
    return head.body_parameters() * dtype.itemsize


def target_embedding(target: torch.nn.Module) -> tuple[torch.Tensor | Callable[[torch.Tensor], torch.Tensor], int, int]:
    """The target's input embedding as a head without `embed_tokens` uses it, without the target's own scale:
    its weight [V, H], or the row lookup of a quantized table (`QuantizedEmbedding.unscaled_rows`); V and H."""
    embedding = target.get_input_embeddings()
    weight = getattr(embedding, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight, int(weight.shape[0]), int(weight.shape[-1])
    rows = embedding.unscaled_rows  # planning refused a table without rows (`check_head`)
    return rows, int(embedding.num_embeddings), int(embedding.embedding_dim)


def _activation_dtype(target: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    """The dtype and device of the target's activations: its embedding weight's (a quantized table's rows come
    out in fp32)."""
    embedding = target.get_input_embeddings()
    weight = getattr(embedding, "weight", None)
    if not isinstance(weight, torch.Tensor):
        weight = next(iter(embedding.buffers()))
        return torch.float32, weight.device
    dtype = weight.dtype if weight.is_floating_point() else torch.float32
    return dtype, weight.device


def _cached(head: Eagle3Head, key: tuple, build: Callable[[], Eagle3Head]) -> Eagle3Head:
    """The copy of `head` cached under `key`, built once."""
    copies = _PREPARED.setdefault(head, {})
    if key not in copies:
        copies[key] = build()
    return copies[key]


def head_precision(head: Eagle3Head, target: torch.nn.Module) -> HeadPrecision:
    """The precision `head` drafts in next to `target` (`drafters.eagle.precision`: its `precision` setting, the
    target's kernels and device)."""
    return choose_precision(head.precision, quantized_kernels(target), _activation_dtype(target)[1])


def prepared_head(head: Eagle3Head, target: torch.nn.Module, precision: HeadPrecision | None = None) -> Eagle3Head:
    """`head` at `precision` (default: `head_precision`) next to `target`: float in the target's activation dtype
    and device, bf16, or its linear layers on the package's int8/int4 kernels (a cached copy when it has to
    change), embedding with the target's input embedding when the head carries none."""
    precision = precision or head_precision(head, target)
    dtype, device = _activation_dtype(target)
    dtype = torch.bfloat16 if precision.name == "bf16" else dtype
    if precision.quantized:
        prepared = _cached(head, (precision.name,), lambda: quantized_copy(head, precision.name)[0])
    elif head.compute_dtype == dtype and head.compute_device == device:
        prepared = head
    else:
        prepared = _cached(head, (dtype, device), lambda: float_copy(head, dtype, device))
    if prepared.embed_tokens is None:
        embedding, rows, _ = target_embedding(target)  # its width checked at planning (`check_head`)
        prepared.use_target_embedding(embedding, rows)
    return prepared


def build_eagle_drafter(
    head: Eagle3Head, target_runner: ModelRunner, static_shapes: bool, vocab_size: int
) -> EagleDrafter:
    """The drafter, with the target runner handing its features over from now on."""
    target_runner.run_eagerly()  # the features come from forward hooks, which a graph replay (if any) does not run
    target = target_runner.model
    tap = LayerTap(target, head.config.layers_for(hf_compat.text_config(target).num_hidden_layers))
    store = FeatureStore(tap, capacity=getattr(target_runner.layout, "capacity", 0))
    target_runner.tap_features(store)
    precision = head_precision(head, target)
    warn_if_fell_back(precision)
    drafter = EagleDrafter(prepared_head(head, target, precision), target_runner, store, vocab_size, static_shapes)
    drafter.precision = precision
    return drafter

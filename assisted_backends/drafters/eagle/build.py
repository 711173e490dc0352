"""Planning and building the EAGLE drafter: the checks a head must pass against its target, the head in the
target's dtype and device, and the hand-over of features from the target's runner.

The head runs in the dtype of the target's activations (its input embedding's), so features need no cast
and the head's cost stays small next to the target's; a published fp16/bf16 head is copied once per
(dtype, device) and cached. The backend's draft precision options do not apply to it.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable

import torch

from assisted_backends import hf_compat
from assisted_backends.drafters.eagle.drafter import EagleDrafter
from assisted_backends.drafters.eagle.features import FeatureStore, LayerTap
from assisted_backends.drafters.eagle.head import Eagle3Head, _rope_config
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options.errors import OptionError

_PREPARED: weakref.WeakKeyDictionary[Eagle3Head, dict[tuple, Eagle3Head]] = weakref.WeakKeyDictionary()


def is_eagle_head(model: object) -> bool:
    return isinstance(model, Eagle3Head)


def check_head(head: Eagle3Head, target: ModelFacts) -> None:
    """OptionError naming `assistant_model` when `head` was trained for another target (vocabulary, width)."""
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


def draft_costs(head: Eagle3Head, target: ModelFacts) -> dict[str, float]:
    """The schedule's priors: c ≈ the head's step parameters over the target's; its prompt pass likewise."""
    step = head.body_parameters()
    return dict(cost_ratio=step / target.parameters, prompt_pass_ratio=step / target.body_parameters)


def target_embedding(target: torch.nn.Module) -> tuple[torch.Tensor | Callable[[torch.Tensor], torch.Tensor], int, int]:
    """The target's input embedding as a head without `embed_tokens` uses it, without the target's own scale:
    its weight [V, H], or the row lookup of a quantized table (`QuantizedEmbedding.unscaled_rows`); V and H."""
    embedding = target.get_input_embeddings()
    weight = getattr(embedding, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight, int(weight.shape[0]), int(weight.shape[-1])
    rows = getattr(embedding, "unscaled_rows", None)
    if rows is None:
        raise OptionError(
            f"{{name}} carries no embed_tokens and the target's input embedding ({type(embedding).__name__}) has "
            "no weight to embed tokens with: use a head that carries embed_tokens",
            name="assistant_model",
        )
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


def prepared_head(head: Eagle3Head, target: torch.nn.Module) -> Eagle3Head:
    """`head` in the target's activation dtype and device (a cached copy when it has to change), embedding
    with the target's input embedding when the head carries none."""
    dtype, device = _activation_dtype(target)
    weight = head.fc.weight
    if weight.dtype == dtype and weight.device == device:
        prepared = head
    else:
        prepared = _PREPARED.setdefault(head, {}).get((dtype, device))
        if prepared is None:
            prepared = copy.deepcopy(head).to(device=device, dtype=dtype).eval()
            prepared.rotary = type(head.rotary)(_rope_config(head.config)).to(device)  # inv_freq kept in fp32
            _PREPARED[head][(dtype, device)] = prepared
    if prepared.embed_tokens is None:
        embedding, rows, width = target_embedding(target)
        if width != head.config.hidden_size:
            raise OptionError(
                f"{{name}} carries no embed_tokens and its width {head.config.hidden_size} differs from the target "
                f"embedding's {width}: it was trained for another target",
                name="assistant_model",
            )
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
    target_runner.feature_tap = store
    return EagleDrafter(prepared_head(head, target), target_runner, store, vocab_size, static_shapes)

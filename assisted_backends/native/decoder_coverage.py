"""Which models the native decoder runs, and the parts of one it reads (`why_not_native`).

The native step reads a loaded quantized model's layers by what they hold, not by their class (native/ sits below
quantized/ and imports none of it): a `BlockLayer` is a linear layer on the package's block kernels (its weight's
`kernel_arguments` are the C++ op's), a `FusedSlice` stands for one sibling of a fused projection (q/k/v,
gate/up: `quantized.fusion.ProjectionSlice`), and a `BlockTable` is a token embedding over a block table
(`quantized.linear.QuantizedEmbedding`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

# model_type -> (activation code of decoder.cpp, whether norms scale by 1 + w, whether each block's output is normed)
FAMILIES = {"llama": (0, False, False), "mistral": (0, False, False), "qwen2": (0, False, False),
            "qwen3": (0, False, False), "gemma3_text": (1, True, True)}  # fmt: skip
_ACTIVATIONS = {0: ("silu",), 1: ("gelu_pytorch_tanh",)}


@runtime_checkable
class BlockLayer(Protocol):
    """A linear layer y = x Wᵀ + b whose `kernel` is "blocks" where W is on the package's block kernels; its
    `weight_data.kernel_arguments(bias)` are the block op's arguments after x (`quantized.blocks.BlockWeight`)."""

    kernel: str
    weight_data: Any
    bias: torch.Tensor | None


@runtime_checkable
class FusedSlice(Protocol):
    """Columns [start, start + N) of a fused projection's output; `shared.fused` is the fused layer."""

    shared: Any
    start: int


@runtime_checkable
class BlockTable(Protocol):
    """A token embedding over a quantized table: `block_meta` is None unless the table is in the block layout
    (`weight_data` then reads it as a `BlockLayer`'s); `embed_scale` multiplies its rows (None: 1)."""

    block_meta: dict[str, int] | None
    weight_data: Any
    embed_scale: torch.Tensor | None


def text_config(model: nn.Module):
    """The config of `model`'s text decoder (a multimodal config's text part)."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def block_linear(layer: object) -> bool:
    """Whether `layer` is a linear layer on the package's block kernels (`BlockLayer`)."""
    return isinstance(layer, BlockLayer) and layer.kernel == "blocks"


def projections(parent: nn.Module, names: Sequence[str]) -> list[BlockLayer] | None:
    """The block layers computing `names` of `parent`: one fused layer (in this order) or one each; None: neither."""
    first = getattr(parent, names[0], None)
    if isinstance(first, FusedSlice):
        shared = first.shared
        slices = [getattr(parent, name, None) for name in names]
        in_order = (
            all(isinstance(s, FusedSlice) and s.shared is shared for s in slices)
            and [s.start for s in slices] == sorted(s.start for s in slices)
            and slices[0].start == 0
        )
        return [shared.fused] if in_order and block_linear(shared.fused) else None
    layers = [getattr(parent, name, None) for name in names]
    return layers if all(block_linear(layer) for layer in layers) else None


def mlp_norm(layer: nn.Module) -> nn.Module | None:
    """The norm before the MLP: Llama's `post_attention_layernorm`, Gemma 3's `pre_feedforward_layernorm` (whose
    `post_attention_layernorm` norms the attention's output)."""
    return getattr(layer, "pre_feedforward_layernorm", None) or getattr(layer, "post_attention_layernorm", None)


def window(model: nn.Module, attention: nn.Module) -> int:
    """A layer's sliding window (0: none): the attention module's own, or Mistral's config-wide one."""
    config = text_config(model)
    size = getattr(attention, "sliding_window", None)
    if size is None and config.model_type == "mistral":
        size = getattr(config, "sliding_window", None)
    return int(size or 0)


def two_tables(model: nn.Module) -> bool:
    """Whether the model's rotary module keeps a table per layer type (Gemma 3's local and global bases)."""
    return "layer_type" in inspect.signature(model.model.rotary_emb.forward).parameters


def native_embedding(embedding: nn.Module) -> bool:
    """Whether the native code reads the embedding's rows itself (a block table, scaled by an fp32 factor or not)."""
    return isinstance(embedding, BlockTable) and embedding.block_meta is not None


def why_not_native(model: nn.Module) -> str | None:
    """Why the native decoder does not run `model` (None: it does): family, options and weights it covers."""
    config = text_config(model)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"its family ({kind}) is not one the native decoder covers yet ({', '.join(FAMILIES)})"
    activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if activation not in _ACTIVATIONS[FAMILIES[kind][0]]:
        return f"its activation ({activation}) is not the one the native decoder computes for {kind}"
    types = getattr(config, "layer_types", None) or ()
    if any(kind not in ("full_attention", "sliding_attention") for kind in types):
        return "it has layers other than full or sliding-window attention"
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, name, None):
            return f"it soft-caps logits ({name})"
    if getattr(config, "use_bidirectional_attention", False):
        return "its attention is bidirectional"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return f"its rotary scaling ({rope.get('rope_type', rope.get('type'))}) depends on the sequence length"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "its modules are not laid out as a Llama-family model's"
    head = model.get_output_embeddings()
    if not block_linear(head) or head.bias is not None:
        return "its LM head is not a block-quantized layer"
    for layer in inner.layers:
        attention, mlp = layer.self_attn, layer.mlp
        if not hasattr(layer, "input_layernorm") or mlp_norm(layer) is None:
            return "its layers' norms are not laid out as a Llama-family layer's"
        if projections(attention, ("q_proj", "k_proj", "v_proj")) is None or not block_linear(attention.o_proj):
            return "an attention projection is not on the package's block kernels"
        if projections(mlp, ("gate_proj", "up_proj")) is None or not block_linear(mlp.down_proj):
            return "an MLP projection is not on the package's block kernels"
        if (getattr(attention, "q_norm", None) is None) != (getattr(attention, "k_norm", None) is None):
            return "it normalizes only one of q and k"
    return None

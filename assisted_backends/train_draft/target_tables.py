"""The target's token tables as dense tensors, whatever stores them: a plain layer's weight, or the rows a
quantized layer dequantizes (`quantized.linear`), so that training reads a quantized target as it reads a float
one. A head trained next to a quantized target learns from the values that target computes with."""

from __future__ import annotations

import torch


def dense_rows(module: torch.nn.Module) -> torch.Tensor:
    """[rows, H] of an input embedding or an output layer: its weight, or a quantized layer's dequantized rows
    (fp32; an embedding's before its scale, as `weight[ids]` is for an `nn.Embedding`)."""
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight
    if hasattr(module, "dequantized_weight"):  # QuantizedLinear
        return module.dequantized_weight()
    if hasattr(module, "unscaled_rows"):  # QuantizedEmbedding
        return module.unscaled_rows(torch.arange(module.num_embeddings))
    raise TypeError(f"cannot read the rows of {type(module).__name__}: neither a weight nor a quantized table")

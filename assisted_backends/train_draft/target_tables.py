"""The target's token tables as dense tensors, whatever stores them: a plain layer's weight, or the rows a
quantized layer dequantizes (`quantized.linear`), so that training reads a quantized target as it reads a float
one. A head trained next to a quantized target learns from the values that target computes with."""

from __future__ import annotations

import itertools

import torch


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (a quantized model keeps its weights in buffers)."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return torch.device("cpu")


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

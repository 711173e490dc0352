"""Weight-only quantized layers on PyTorch's CPU kernels, and `quantize_model` for any HF causal LM.

`QuantizedLinear`   y = x Wᵀ + b with W held as `Int8Weight` (int8, one scale per output row) or
                    `Int4Weight` (int4 groups of 32/64/128, one or two planes). x is cast to the
                    weights' compute dtype (bf16: the kernels' vectorised path), the result back to
                    x's dtype; the bias is added in x's dtype.
`QuantizedEmbedding` row gather of a quantized [V, K] table: only the looked-up rows are dequantized
                    (to fp32, the exact values the kernel multiplies by). Built over a
                    `QuantizedLinear` it shares that layer's tensors: a tied embedding / LM head is
                    one storage.

Both are batch-invariant where the kernels are: row m of a call over M rows equals that row alone.
"""

from __future__ import annotations

import torch
from torch import nn

from assisted_backends.quantized import kernels
from assisted_backends.quantized.int4_layout import layout
from assisted_backends.quantized.packing import (
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    int4_from_float,
    int8_from_float,
)

SCHEMES = ("int8", "int4")


class QuantizedLinear(nn.Module):
    """y = x Wᵀ + b on `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu`; W [N, K] quantized."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        if isinstance(weight, Int8Weight):
            self.scheme, self.group_size, self.planes = "int8", 0, 1
            self.register_buffer("codes", kernels.aligned(weight.codes))
            self.register_buffer("scales", kernels.aligned(weight.scales))
            self.compute_dtype = weight.scales.dtype
        else:
            self.scheme, self.group_size, self.planes = "int4", weight.group_size, weight.planes
            self.register_buffer("packed", kernels.aligned(weight.packed))
            self.register_buffer("scale_zeros", kernels.aligned(weight.scale_zeros))
            self.compute_dtype = weight.scale_zeros.dtype
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def _apply(self, fn, recurse: bool = True):
        """`.to(dtype)` / `.float()` on a model casts every float buffer: the scales keep the kernels' dtype."""
        super()._apply(fn, recurse)
        for name in ("scales", "scale_zeros"):
            buffer = getattr(self, name, None)
            if buffer is not None and buffer.dtype != self.compute_dtype:
                setattr(self, name, kernels.aligned(buffer.to(self.compute_dtype)))
        return self

    @classmethod
    def from_float(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        scheme: str,
        group_size: int = 32,
        dtype: torch.dtype = kernels.FAST_DTYPE,
    ) -> QuantizedLinear:
        """Quantize a float weight [N, K] (`scheme` "int8" per row, or "int4" in groups of `group_size`)."""
        if scheme == "int8":
            return cls(int8_from_float(weight, dtype), bias)
        if scheme == "int4":
            return cls(int4_from_float(weight, group_size, dtype), bias)
        raise ValueError(f"scheme {scheme!r} is not one of {SCHEMES}")

    @property
    def weight_data(self) -> QuantizedWeight:
        """The stored weight as a packing object (shares this module's tensors)."""
        if self.scheme == "int8":
            return Int8Weight(self.codes, self.scales)
        return Int4Weight(self.packed, self.scale_zeros, self.group_size, self.planes, self.in_features)

    def dequantized_weight(self) -> torch.Tensor:
        """W [N, K] in fp32 as the kernel sees it (for checks; costs 4 bytes a weight)."""
        return self.weight_data.rows(torch.arange(self.out_features))

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        rows = kernels.aligned(x.reshape(-1, self.in_features).to(self.compute_dtype))
        if self.planes > 1:
            rows = torch.cat([rows] * self.planes, dim=1)
        return rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self._rows(x)  # [M, P·K]
        if rows.shape[0] == 0:
            out = rows.new_zeros(0, self.out_features)
        elif self.scheme == "int8":
            out = kernels.int8_mm(rows, self.codes, self.scales)
        else:
            out = kernels.int4_mm(rows, self.packed, self.group_size, self.scale_zeros)
        out = out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        detail = "per-row scales" if self.scheme == "int8" else f"group {self.group_size}, {self.planes} plane(s)"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, {self.scheme} ({detail}), "
            f"{str(self.compute_dtype).removeprefix('torch.')} compute, bias={self.bias is not None}"
        )


class QuantizedEmbedding(nn.Module):
    """Row lookup in a quantized table [V, K]; the rows come out in fp32 (times `embed_scale` if given)."""

    def __init__(
        self,
        table: QuantizedLinear,
        padding_idx: int | None = None,
        embed_scale: torch.Tensor | float | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features
        self.padding_idx = padding_idx
        self.scheme, self.group_size, self.planes = table.scheme, table.group_size, table.planes
        names = ("codes", "scales") if table.scheme == "int8" else ("packed", "scale_zeros")
        for name in names:  # the same tensor objects: one storage for the embedding and the head
            self.register_buffer(name, getattr(table, name))
        self.register_buffer(
            "embed_scale", None if embed_scale is None else torch.as_tensor(embed_scale, dtype=torch.float32)
        )
        self.packed_layout = layout() if table.scheme == "int4" else None  # resolved once, outside forward

    def unscaled_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The dequantized rows [..., K] of `input_ids`, before `embed_scale`: what `weight[input_ids]` is for an
        nn.Embedding (an EAGLE-3 head embeds tokens with this)."""
        flat = input_ids.reshape(-1)
        if self.scheme == "int8":
            rows = Int8Weight(self.codes, self.scales).rows(flat)
        else:
            weight = Int4Weight(self.packed, self.scale_zeros, self.group_size, self.planes, self.embedding_dim)
            rows = weight.rows(flat, self.packed_layout)
        return rows.view(*input_ids.shape, self.embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.unscaled_rows(input_ids)
        return rows if self.embed_scale is None else rows * self.embed_scale

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, {self.scheme}, gathers and dequantizes looked-up rows only"
        )


def why_not_quantizable(out_features: int, in_features: int, scheme: str, group_size: int) -> str:
    """'' if a [out, in] weight can use `scheme`, else why not."""
    if scheme == "int8" and not kernels.int8_supported(in_features):
        return f"in_features {in_features} is not a multiple of {kernels.INT8_COLUMN_MULTIPLE} (int8 kernel)"
    if scheme == "int4" and not kernels.int4_supported(out_features, in_features, group_size):
        return (
            f"[{out_features}, {in_features}] needs out_features % {kernels.INT4_ROW_MULTIPLE} == 0 and "
            f"in_features % {group_size} == 0 (int4 kernel)"
        )
    return ""


def _dense_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(W [out, in], bias) of an nn.Linear or a transformers Conv1D (stored [in, out]); else None."""
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return module.weight.t(), module.bias
    return None


def quantize_model(
    model: nn.Module,
    scheme: str = "int8",
    group_size: int = 32,
    dtype: torch.dtype = kernels.FAST_DTYPE,
    embeddings: bool = True,
) -> nn.Module:
    """Replace every eligible nn.Linear / Conv1D of `model` (in place) by a QuantizedLinear; return it.

    `scheme` "int8" (per-row scales) or "int4" (groups of `group_size`). Layers whose shape the
    kernel cannot take stay as they are, listed with the reason in `model.quantization_report`.
    With `embeddings`, the input embedding becomes a QuantizedEmbedding too; when the LM head is tied
    to it (one Parameter), both share one quantized storage.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not one of {SCHEMES}")
    missing = kernels.available().missing(scheme)
    if missing:
        raise NotImplementedError(missing)
    report: dict[str, str] = {}
    input_embedding = model.get_input_embeddings() if embeddings and hasattr(model, "get_input_embeddings") else None
    output_embedding = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = (
        input_embedding is not None
        and output_embedding is not None
        and getattr(output_embedding, "weight", None) is getattr(input_embedding, "weight", None)
    )
    shared: QuantizedLinear | None = None
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if embeddings and child is input_embedding and isinstance(child, nn.Embedding):
                why = why_not_quantizable(child.num_embeddings, child.embedding_dim, scheme, group_size)
                if why:
                    report[full] = f"kept: {why}"
                    continue
                shared = shared or QuantizedLinear.from_float(child.weight, None, scheme, group_size, dtype)
                scale = getattr(child, "embed_scale", None)
                setattr(parent, name, QuantizedEmbedding(shared, child.padding_idx, scale))
                report[full] = f"{scheme} embedding" + (" (shared with the LM head)" if tied else "")
                continue
            dense = _dense_weight(child)
            if dense is None:
                continue
            weight, bias = dense
            why = why_not_quantizable(weight.shape[0], weight.shape[1], scheme, group_size)
            if why:
                report[full] = f"kept: {why}"
                continue
            if tied and child is output_embedding:
                shared = shared or QuantizedLinear.from_float(weight, None, scheme, group_size, dtype)
                layer = QuantizedLinear(shared.weight_data, bias)
                report[full] = f"{scheme} (shares the embedding's storage)"
            else:
                layer = QuantizedLinear.from_float(weight, bias, scheme, group_size, dtype)
                report[full] = scheme
            setattr(parent, name, layer)
    model.quantization_report = report
    return model


def quantized_scheme(model: nn.Module) -> str | None:
    """The scheme of `model`'s quantized layers ("int8", "int4", "int8+int4" for a mix), or None if it has none."""
    schemes = sorted({m.scheme for m in model.modules() if isinstance(m, QuantizedLinear)})
    return "+".join(schemes) if schemes else None

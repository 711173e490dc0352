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

from assisted_backends.model_facts import QUANTIZED_MARKER  # noqa: F401 (the marker the quantizers set, here too)
from assisted_backends.native import extension
from assisted_backends.quantized import blocks, kernels
from assisted_backends.quantized.blocks import BlockWeight
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

    def __init__(self, weight: QuantizedWeight | BlockWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.block_meta: dict[str, int] | None = None
        if isinstance(weight, BlockWeight):  # the package's kernels (`blocks`), fp32 in and out
            self.scheme, self.group_size, self.planes = f"int{weight.bits}", weight.group, 1
            self.block_meta = weight.meta()
            for name, tensor in weight.tensors().items():
                self.register_buffer(f"block_{name}", tensor)
            self.compute_dtype = torch.float32
        elif isinstance(weight, Int8Weight):
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
        self._bind_block_arguments()

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name in self._buffers and "_block_arguments" in self.__dict__:  # a replaced buffer: rebind the arguments
            self._bind_block_arguments()

    @property
    def kernel(self) -> str:
        """Which kernels run it: "blocks" (the package's) or "aten" (PyTorch's int4/int8 kernels)."""
        return "aten" if self.block_meta is None else "blocks"

    def buffer_names(self) -> tuple[str, ...]:
        """The names of the buffers that hold the weight (shared by a tied embedding)."""
        if self.block_meta is not None:
            return tuple(name for name, _ in self.named_buffers(recurse=False) if name.startswith("block_"))
        return ("codes", "scales") if self.scheme == "int8" else ("packed", "scale_zeros")

    def _apply(self, fn, recurse: bool = True):
        _apply_keeping_scales(self, lambda: super(QuantizedLinear, self)._apply(fn, recurse))
        self._bind_block_arguments()
        return self

    @classmethod
    def from_float(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        scheme: str,
        group_size: int = 32,
        dtype: torch.dtype = kernels.FAST_DTYPE,
        activations: str = "int8",
    ) -> QuantizedLinear:
        """Quantize a float weight [N, K]: on the package's kernels (`blocks.from_float`, groups of 32, activations
        quantized to int8 per block) where they run, `dtype` is the fast one and `activations` is "int8"; else for
        PyTorch's kernels (activations in `dtype`), "int8" per row or "int4" in groups of `group_size` in `dtype`
        (fp32: the exact reference)."""
        if scheme not in SCHEMES:
            raise ValueError(f"scheme {scheme!r} is not one of {SCHEMES}")
        if activations == "int8" and dtype != torch.float32 and group_size == 32 and extension.available():
            block_weight = blocks.from_float(weight, 4 if scheme == "int4" else 8)
            if block_weight is not None:
                return cls(block_weight, bias)
        if scheme == "int8":
            return cls(int8_from_float(weight, dtype), bias)
        return cls(int4_from_float(weight, group_size, dtype), bias)

    @property
    def weight_data(self) -> QuantizedWeight | BlockWeight:
        """The stored weight as a packing object (shares this module's tensors)."""
        if self.block_meta is not None:
            tensors = {name.removeprefix("block_"): getattr(self, name) for name in self.buffer_names()}
            return BlockWeight.from_stored(tensors, self.block_meta)
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
        if self._block_arguments is not None:  # one call: the op reshapes, adds the bias and casts back
            return self._block_op(x, *self._block_arguments, extension.forced_isa())
        rows = self._rows(x)  # [M, P·K]
        if rows.shape[0] == 0:
            out = rows.new_zeros(0, self.out_features)
        elif self.scheme == "int8":
            out = kernels.int8_mm(rows, self.codes, self.scales)
        else:
            out = kernels.int4_mm(rows, self.packed, self.group_size, self.scale_zeros)
        out = out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)

    def _bind_block_arguments(self) -> None:
        """The op's arguments, gathered once (attribute lookups on a module cost more than the op's own checks)."""
        self._block_arguments = None
        if self.block_meta is not None:
            self._block_arguments = self.weight_data.kernel_arguments(self.bias)
            self._block_op = torch.ops.assisted_backends.block_linear.default

    def extra_repr(self) -> str:
        if self.block_meta is not None:
            meta = self.block_meta
            return (
                f"in_features={self.in_features}, out_features={self.out_features}, {meta['bits']}-bit blocks of "
                f"{meta['group']}, the package's kernels, bias={self.bias is not None}"
            )
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
        self.block_meta = table.block_meta
        for name in table.buffer_names():  # the same tensor objects: one storage for the embedding and the head
            self.register_buffer(name, getattr(table, name))
        self.register_buffer(
            "embed_scale", None if embed_scale is None else torch.as_tensor(embed_scale, dtype=torch.float32)
        )
        self.packed_layout = layout() if table.scheme == "int4" and table.block_meta is None else None

    def _apply(self, fn, recurse: bool = True):
        _apply_keeping_scales(self, lambda: super(QuantizedEmbedding, self)._apply(fn, recurse))
        return self

    def unscaled_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The dequantized rows [..., K] of `input_ids`, before `embed_scale`: what `weight[input_ids]` is for an
        nn.Embedding (an EAGLE-3 head embeds tokens with this)."""
        flat = input_ids.reshape(-1)
        if self.block_meta is not None:
            tensors = {name.removeprefix("block_"): buffer for name, buffer in self.named_buffers(recurse=False)
                       if name.startswith("block_")}  # fmt: skip
            rows = BlockWeight.from_stored(tensors, self.block_meta).rows(flat)
        elif self.scheme == "int8":
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


_SCALE_BUFFERS = ("scales", "scale_zeros", "block_d", "block_dmin")  # float buffers whose dtype the kernels fix


def _apply_keeping_scales(module: nn.Module, apply) -> None:
    """Run `apply` (nn.Module._apply): a `.to(dtype)` / `.float()` on the model casts every float buffer, but the
    kernels' scales keep their values and dtype; they follow a device move only."""
    kept = {name: module._buffers[name] for name in _SCALE_BUFFERS if module._buffers.get(name) is not None}
    apply()
    for name, original in kept.items():
        moved = module._buffers[name]
        if moved.dtype != original.dtype:
            setattr(module, name, kernels.aligned(original.to(moved.device)))


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
    activations: str = "int8",
) -> nn.Module:
    """Replace every eligible nn.Linear / Conv1D of `model` (in place) by a QuantizedLinear; return it.

    `scheme` "int8" (per-row scales) or "int4" (groups of `group_size`). Layers whose shape the
    kernel cannot take stay as they are, listed with the reason in `model.quantization_report`.
    With `embeddings`, the input embedding becomes a QuantizedEmbedding too; when the LM head is tied
    to it (one Parameter), both share one quantized storage. `activations` "int8": the package's kernels where
    they run (`QuantizedLinear.from_float`); "float": PyTorch's weight-only kernels, activations unquantized.
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
                shared = shared or QuantizedLinear.from_float(
                    child.weight, None, scheme, group_size, dtype, activations
                )
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
                shared = shared or QuantizedLinear.from_float(weight, None, scheme, group_size, dtype, activations)
                layer = QuantizedLinear(shared.weight_data, bias)
                report[full] = f"{scheme} (shares the embedding's storage)"
            else:
                layer = QuantizedLinear.from_float(weight, bias, scheme, group_size, dtype, activations)
                report[full] = scheme
            setattr(parent, name, layer)
    model.quantization_report = report
    return model


def quantized_scheme(model: nn.Module) -> str | None:
    """The scheme of `model`'s quantized layers ("int8", "int4", "int8+int4" for a mix), or None if it has none."""
    schemes = sorted({m.scheme for m in model.modules() if isinstance(m, QuantizedLinear)})
    return "+".join(schemes) if schemes else None


def kernel_report(model: nn.Module) -> str:
    """One line: which kernels `model`'s quantized layers run on, and why not the package's where they don't."""
    kinds = {m.kernel for m in model.modules() if isinstance(m, QuantizedLinear)}
    step = getattr(model, "step_report", None)  # which forward pass ran and why (`quantized.native_decoder`)
    if step:
        return _kernel_line(kinds) + "; " + step
    return _kernel_line(kinds)


def _kernel_line(kinds: set[str]) -> str:
    if kinds == {"blocks"}:
        return extension.status().line()
    if "blocks" in kinds:
        return extension.status().line() + "; requantized layers on PyTorch's int4/int8 kernels"
    reason = extension.status().reason or "the package's kernels take a .gguf file's blocks only"
    return f"quantized layers: PyTorch's int4/int8 kernels ({reason})"

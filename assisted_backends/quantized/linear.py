"""Weight-only quantized layers on CPU kernels, and `quantize_model` for any HF causal LM.

`QuantizedLinear`   y = x Wᵀ + b with W any `weights.LinearWeight`: the package's block kernels (`BlockWeight`),
                    or PyTorch's (`Int8Weight`: int8, one scale per output row; `Int4Weight`: int4 groups of
                    32/64/128, one or more planes, x cast to the weights' compute dtype and the result back).
`QuantizedEmbedding` row gather of a quantized [V, K] table: only the looked-up rows are dequantized
                    (to fp32, the exact values the kernel multiplies by). Built over a
                    `QuantizedLinear` it shares that layer's tensors: a tied embedding / LM head is
                    one storage.

Neither branches on the weight's class: both keep the weight's tensors as buffers, rebuild the weight from them
(`from_buffers`, again whenever a buffer is replaced or moved) and ask it (`weights.py`).
Both are batch-invariant where the kernels are: row m of a call over M rows equals that row alone.
"""

from __future__ import annotations

import torch
from torch import nn

from assisted_backends.model_facts import QUANTIZED_MARKER  # noqa: F401 (the marker the quantizers set, here too)
from assisted_backends.native import extension
from assisted_backends.quantized import blocks, kernels
from assisted_backends.quantized.packing import int4_from_float, int8_from_float
from assisted_backends.quantized.weights import LinearWeight

SCHEMES = ("int8", "int4")


class _HoldsWeight(nn.Module):
    """A module whose weight is a `LinearWeight` kept as buffers: `weight_data` rebuilds it over them; `_bind`
    (after any buffer is replaced, and after `.to()` / `.float()`) refreshes what `forward` calls."""

    def _hold(self, weight: LinearWeight) -> None:
        self.weight_format = type(weight)
        self.weight_meta = weight.meta()
        tensors = weight.buffers()
        self._weight_names = tuple(tensors)
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name in self._buffers and "_weight_names" in self.__dict__:  # a replaced buffer: rebind
            self._bind()

    def _apply(self, fn, recurse: bool = True):
        """`.to(dtype)` / `.float()` on the model casts every float buffer, but a weight's tensors keep their values
        and dtype (the kernels fix them); they follow a device move only."""
        kept = {name: self._buffers[name] for name in self._weight_names}
        super()._apply(fn, recurse)
        for name, original in kept.items():
            moved = self._buffers[name]
            if moved.dtype != original.dtype:
                self._buffers[name] = kernels.aligned(original.to(moved.device))
        self._bind()
        return self

    def _bind(self) -> None:
        self._weight = self.weight_data

    @property
    def weight_data(self) -> LinearWeight:
        """The stored weight as its format's object (shares this module's tensors)."""
        return self.weight_format.from_buffers({name: self._buffers[name] for name in self._weight_names},
                                               self.weight_meta)  # fmt: skip

    def buffer_names(self) -> tuple[str, ...]:
        """The names of the buffers that hold the weight (shared by a tied embedding)."""
        return self._weight_names

    @property
    def kernel(self) -> str:
        """Which kernels run it: "blocks" (the package's) or "aten" (PyTorch's int4/int8 kernels)."""
        return self.weight_format.kernel

    @property
    def scheme(self) -> str:
        return self._weight.scheme

    @property
    def group_size(self) -> int:
        return self._weight.group_size

    @property
    def planes(self) -> int:
        return self._weight.planes

    @property
    def compute_dtype(self) -> torch.dtype:
        return self._weight.compute_dtype

    @property
    def block_meta(self) -> dict[str, int] | None:
        """The package's block layout's integers, None on PyTorch's kernels (`native.decoder_coverage` reads it)."""
        return self.weight_meta if self.kernel == "blocks" else None


class QuantizedLinear(_HoldsWeight):
    """y = x Wᵀ + b, W [N, K] any `LinearWeight` (the package's block kernels, or PyTorch's int8 / int4 ones)."""

    def __init__(self, weight: LinearWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self._hold(weight)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self._bind()

    def _bind(self) -> None:
        super()._bind()
        self._forward = self._weight.bind(self._buffers["bias"])

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

    def dequantized_weight(self) -> torch.Tensor:
        """W [N, K] in fp32 as the kernel sees it (for checks; costs 4 bytes a weight)."""
        return self.weight_data.rows(torch.arange(self.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, {self._weight.describe()}, "
            f"bias={self.bias is not None}"
        )


class QuantizedEmbedding(_HoldsWeight):
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
        self._hold(table.weight_data)  # the same tensor objects: one storage for the embedding and the head
        self.register_buffer(
            "embed_scale", None if embed_scale is None else torch.as_tensor(embed_scale, dtype=torch.float32)
        )
        self._bind()

    def unscaled_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The dequantized rows [..., K] of `input_ids`, before `embed_scale`: what `weight[input_ids]` is for an
        nn.Embedding (an EAGLE-3 head embeds tokens with this)."""
        rows = self._weight.rows(input_ids.reshape(-1))
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
    step = getattr(model, "step_report", None)  # which forward pass ran and why (`native.decoder_model`)
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

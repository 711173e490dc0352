"""The one interface a quantized weight W [N, K] offers `QuantizedLinear` and `QuantizedEmbedding`.

A layer holds its weight as buffers (the module's state: `state_dict`, `.to()`, sharing between a tied embedding
and LM head) plus a format name and a few integers (`meta()`); it rebuilds the weight object from them
(`from_buffers`) and asks it for everything else. No layer branches on the weight's class: adding a format is
adding a class that implements `LinearWeight` and an entry in `formats.FORMATS` (whose names also name the
repacked-weights cache's entries, `quantized.model`). It imports none of the formats: they and
the layers stand on it.

| format   | class                | kernels                                 | buffers                               |
|----------|----------------------|-----------------------------------------|---------------------------------------|
| "blocks" | `blocks.BlockWeight` | the package's (`native/`), x as int8    | block_codes, block_d (+ dmin, sc, mn) |
| "int8"   | `packing.Int8Weight` | PyTorch's `_weight_int8pack_mm`         | codes, scales                         |
| "int4"   | `packing.Int4Weight` | PyTorch's `_weight_int4pack_mm_for_cpu` | packed, scale_zeros                   |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class LinearWeight(Protocol):
    """W [N, K] in one kernel layout. Class attributes: `format` (its name in `formats.FORMATS`), `kernel` ("blocks":
    the package's kernels, "aten": PyTorch's)."""

    format: str
    kernel: str

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) = (out_features, in_features)."""

    @property
    def nbytes(self) -> int:
        """Bytes of the stored tensors."""

    @property
    def scheme(self) -> str:
        """The precision a report names: "int8" or "int4"."""

    @property
    def group_size(self) -> int:
        """Columns per scale group (0: one scale per row)."""

    @property
    def planes(self) -> int:
        """int4 planes summed per weight (1 but for `Int4Weight` carrying more than 4 bits)."""

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the kernel takes x in."""

    def buffers(self) -> dict[str, torch.Tensor]:
        """The stored tensors by the layer's buffer names (as the kernel reads them: aligned, contiguous)."""

    def meta(self) -> dict[str, int]:
        """What besides the tensors rebuilds the weight (`from_buffers`); JSON-serialisable."""

    @classmethod
    def from_buffers(cls, buffers: dict[str, torch.Tensor], meta: dict[str, int]) -> LinearWeight:
        """The weight over these tensors (shared, not copied)."""

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Dequantized fp32 rows [R, K] of W, the values the kernel multiplies by."""

    def bind(self, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        """x [..., K] -> x Wᵀ + b [..., N] in x's dtype, its arguments gathered once."""

    def describe(self) -> str:
        """A phrase for the layer's repr."""

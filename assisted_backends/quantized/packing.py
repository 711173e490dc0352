"""Quantized weights in the kernels' layouts, made from float weights or from integer codes.

Notation: W [N, K] (out_features x in_features), rows n, columns k, groups of g columns.

``Int8Weight``   w[n, k] = q[n, k] · s[n]                 q int8 [N, K], s [N]
``Int4Weight``   w[n, k] = Σ_p ((q_p[n, k] − 8) · s_p[k // g, n] + z_p[k // g, n])
                 over P planes p, each plane a 4-bit code matrix over the same K columns, stored
                 side by side as one packed [N, P·K] weight so that one kernel call on
                 x' = [x, …, x] computes the sum. P planes carry signed values of up to 4·P bits
                 exactly (`int4_from_values`: the nibbles of their two's complement).

Scales and zeros are stored in the compute dtype (bf16 for speed, fp32 for the exact reference).

From integer values (`int4_from_values`): the source is w = S·v + Z per group (v signed integers,
S and Z fp32). The values go over unchanged; S and Z are rounded to the compute dtype (round to
nearest even); every other stored number is a power-of-two multiple of the rounded S (exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from assisted_backends.quantized import kernels
from assisted_backends.quantized.int4_layout import Int4Layout, layout
from assisted_backends.quantized.rounding import round_up_to


@dataclass
class Int8Weight:
    """w = q · s per output row: codes int8 [N, K], scales [N] in the compute dtype."""

    format: ClassVar[str] = "int8"
    kernel: ClassVar[str] = "aten"
    group_size: ClassVar[int] = 0
    planes: ClassVar[int] = 1

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def scheme(self) -> str:
        return "int8"

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.scales.dtype

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Dequantized fp32 rows [R, K], exactly the kernel's fp32 weights."""
        return kernels.dequantize_int8(self.codes[index], self.scales[index])

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def buffers(self) -> dict[str, torch.Tensor]:
        """The tensors by buffer name, aligned as the kernel reads them."""
        return {"codes": kernels.aligned(self.codes), "scales": kernels.aligned(self.scales)}

    def meta(self) -> dict[str, int]:
        return {}

    @classmethod
    def from_buffers(cls, buffers: dict[str, torch.Tensor], meta: dict[str, int]) -> Int8Weight:
        return cls(buffers["codes"], buffers["scales"])

    def product(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [M, K] (compute dtype, aligned, M > 0) · Wᵀ -> [M, N] in the compute dtype."""
        return kernels.int8_mm(rows, self.codes, self.scales)

    def bind(self, bias: torch.Tensor | None) -> AtenLinear:
        return AtenLinear(self, bias)

    def describe(self) -> str:
        return f"int8 (per-row scales), {str(self.compute_dtype).removeprefix('torch.')} compute"


@dataclass
class Int4Weight:
    """Sum of `planes` int4 planes: packed uint8 [N, P·K/2], scale_zeros [P·K/g, N, 2] (compute dtype)."""

    format: ClassVar[str] = "int4"
    kernel: ClassVar[str] = "aten"

    packed: torch.Tensor
    scale_zeros: torch.Tensor
    group_size: int
    planes: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.scale_zeros.shape[1], self.in_features)

    @property
    def scheme(self) -> str:
        return "int4"

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.scale_zeros.dtype

    def rows(self, index: torch.Tensor, packed_layout: Int4Layout | None = None) -> torch.Tensor:
        """Dequantized fp32 rows [R, K]: each plane as the kernel's fma, planes summed in fp32."""
        n, k = self.shape
        wide = k * self.planes
        found = layout() if packed_layout is None else packed_layout
        codes = found.codes(self.packed, index, n, wide)  # [R, P·K]
        sz = self.scale_zeros[:, index, :].float()  # [P·K/g, R, 2]
        weights = kernels.dequantize_int4(codes, sz[..., 0].t(), sz[..., 1].t(), self.group_size)
        return weights.view(len(index), self.planes, k).sum(dim=1) if self.planes > 1 else weights

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale_zeros.nbytes

    def buffers(self) -> dict[str, torch.Tensor]:
        """The tensors by buffer name, aligned as the kernel reads them."""
        return {"packed": kernels.aligned(self.packed), "scale_zeros": kernels.aligned(self.scale_zeros)}

    def meta(self) -> dict[str, int]:
        return {"group_size": self.group_size, "planes": self.planes, "in_features": self.in_features}

    @classmethod
    def from_buffers(cls, buffers: dict[str, torch.Tensor], meta: dict[str, int]) -> Int4Weight:
        return cls(buffers["packed"], buffers["scale_zeros"], meta["group_size"], meta["planes"], meta["in_features"])

    def product(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [M, P·K] (the input P times side by side, compute dtype, M > 0) · Wᵀ -> [M, N]: the planes' sum."""
        return kernels.int4_mm(rows, self.packed, self.group_size, self.scale_zeros)

    def bind(self, bias: torch.Tensor | None) -> AtenLinear:
        return AtenLinear(self, bias)

    def describe(self) -> str:
        detail = f"group {self.group_size}, {self.planes} plane(s)"
        return f"int4 ({detail}), {str(self.compute_dtype).removeprefix('torch.')} compute"


@dataclass(frozen=True)
class AtenLinear:
    """y = x Wᵀ + b on PyTorch's weight-only kernels: x cast to the compute dtype (P copies side by side for P
    planes), the product cast back to x's dtype, the bias added in x's dtype."""

    weight: Int8Weight | Int4Weight
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        out_features, in_features = weight.shape
        rows = kernels.aligned(x.reshape(-1, in_features).to(weight.compute_dtype))
        if weight.planes > 1:
            rows = torch.cat([rows] * weight.planes, dim=1)  # [M, P·K]
        out = rows.new_zeros(0, out_features) if rows.shape[0] == 0 else weight.product(rows)
        out = out.reshape(*x.shape[:-1], out_features).to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)


QuantizedWeight = Int8Weight | Int4Weight


def int8_from_float(weight: torch.Tensor, dtype: torch.dtype = kernels.FAST_DTYPE) -> Int8Weight:
    """Symmetric per-row int8: s = max|w_n| / 127 rounded up to `dtype`, q = round(w / s); |w − q·s| ≤ s/2."""
    weight = weight.detach().float()
    scales = round_up_to(weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0, dtype)
    codes = torch.round(weight / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(codes.contiguous(), scales.contiguous())


def int4_from_float(weight: torch.Tensor, group_size: int, dtype: torch.dtype = kernels.FAST_DTYPE) -> Int4Weight:
    """Asymmetric group-wise int4: per group s = (max − min)/15, codes q = round((w − min)/s) ∈ [0, 15]."""
    weight = weight.detach().float()
    n, k = weight.shape
    groups = weight.view(n, k // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((high - low) / 15.0).clamp(min=torch.finfo(torch.float32).tiny)
    stored_scale = scales.to(dtype).float()
    zeros = (low + 8.0 * stored_scale).to(dtype).float()  # q = 0 decodes to about `low`
    codes = torch.round((groups - zeros[..., None]) / stored_scale[..., None]) + 8.0
    codes = codes.clamp(0, 15).to(torch.uint8).view(n, k)
    packed = kernels.pack_int4_codes(codes)
    return Int4Weight(packed, kernels.scale_zeros_tensor(stored_scale, zeros, dtype), group_size, 1, k)


_PACK_ROWS = 4096  # a multiple of the packed layout's 64-row blocks


def planes_for(bits: int) -> int:
    """int4 planes needed for signed values of `bits` bits (two's complement, 4 bits a plane)."""
    return (bits + 3) // 4


def int4_from_values(
    values: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    bits: int,
    dtype: torch.dtype = kernels.FAST_DTYPE,
) -> Int4Weight:
    """w = S·v + Z group-wise -> Int4Weight; v [N, K] signed integers of `bits` bits, S, Z fp32 [N, K/g].

    v is split into P = ceil(bits/4) nibbles of its two's complement: planes below the top hold
    unsigned nibbles u_p (kernel code u_p, scale 16^p·S', zero 8·16^p·S', i.e. u_p·16^p·S' exactly);
    the top plane holds the signed nibble s = v >> 4(P−1) (code s + 8, scale 16^(P−1)·S', zero Z').
    S' = S and Z' = Z rounded to `dtype`; every other zero is a power-of-two multiple of S' (exact),
    so w' = S'·v + Z' with nothing else rounded.
    """
    planes = planes_for(bits)
    n, k = values.shape
    stored = scales.to(dtype)
    plane_scales, plane_zeros = [], []
    for plane in range(planes):
        multiple = float(16**plane)
        plane_scales.append((stored.float() * multiple).to(dtype))
        if plane == planes - 1:
            plane_zeros.append(torch.zeros_like(stored) if zeros is None else zeros.to(dtype))
        else:
            plane_zeros.append((stored.float() * (8.0 * multiple)).to(dtype))
    chunks = []
    for start in range(0, n, _PACK_ROWS):  # row chunks bound the int32 codes the packer wants
        part = values[start : start + _PACK_ROWS]
        codes = torch.empty(part.shape[0], planes * k, dtype=torch.int32)
        for plane in range(planes):
            shifted = part >> (4 * plane)
            target = codes[:, plane * k : (plane + 1) * k]
            if plane == planes - 1:
                torch.add(shifted, 8, out=target)
            else:
                torch.bitwise_and(shifted, 0x0F, out=target)
        chunks.append(kernels.pack_int4_codes(codes, rows_per_chunk=_PACK_ROWS))
    packed = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
    scale_zeros = kernels.scale_zeros_tensor(torch.cat(plane_scales, dim=1), torch.cat(plane_zeros, dim=1), dtype)
    return Int4Weight(packed, scale_zeros, group_size, planes, k)

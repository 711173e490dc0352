"""Quantized weights in the kernels' layouts, made from float weights or from integer codes.

Notation: W [N, K] (out_features x in_features), rows n, columns k, groups of g columns.

``Int8Weight``   w[n, k] = q[n, k] · s[n]                 q int8 [N, K], s [N]
``Int4Weight``   w[n, k] = Σ_p ((q_p[n, k] − 8) · s_p[k // g, n] + z_p[k // g, n])
                 over P planes p (P = 1 or 2), each plane a 4-bit code matrix over the same K
                 columns, stored side by side as one packed [N, P·K] weight so that one kernel call
                 on x' = [x, x] computes the sum. Two planes carry codes of 5 to 8 bits exactly:
                 c = lo + 16·hi, plane 0 holds lo with scale S, plane 1 holds hi with scale 16·S.

Scales and zeros are stored in the compute dtype (bf16 for speed, fp32 for the exact reference).

From integer codes (`int4_from_codes`): the source is w = S·c + O per group (c ∈ [0, 2^b), b ≤ 8,
S and O fp32). Codes go over unchanged; S is rounded to the compute dtype (round to nearest even);
the zeros are chosen per group, among the exact splittings, to land nearest their target:
    O = −c0·S (a code offset):  target w' = S'·(c − c0), exact in the stored form whenever the zeros
                                 (8 − c0)·S' (one plane) or a two-term split of (136 − c0)·S' are
                                 representable (c0 = 8, 16, 128 are; see `_plane_zeros`).
    O free:                      zeros rounded, centred on the middle code (`zero_target`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assisted_backends.quantized import kernels
from assisted_backends.quantized.int4_layout import layout


@dataclass
class Int8Weight:
    """w = q · s per output row: codes int8 [N, K], scales [N] in the compute dtype."""

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Dequantized fp32 rows [R, K], exactly the kernel's fp32 weights."""
        return kernels.dequantize_int8(self.codes[index], self.scales[index])

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes


@dataclass
class Int4Weight:
    """Sum of `planes` int4 planes: packed uint8 [N, P·K/2], scale_zeros [P·K/g, N, 2] (compute dtype)."""

    packed: torch.Tensor
    scale_zeros: torch.Tensor
    group_size: int
    planes: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.scale_zeros.shape[1], self.in_features)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Dequantized fp32 rows [R, K]: each plane as the kernel's fma, planes summed in fp32."""
        n, k = self.shape
        wide = k * self.planes
        codes = layout().codes(self.packed, index, n, wide)  # [R, P·K]
        sz = self.scale_zeros[:, index, :].float()  # [P·K/g, R, 2]
        weights = kernels.dequantize_int4(codes, sz[..., 0].t(), sz[..., 1].t(), self.group_size)
        return weights.view(len(index), self.planes, k).sum(dim=1) if self.planes > 1 else weights

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale_zeros.nbytes


QuantizedWeight = Int8Weight | Int4Weight


def round_up_to(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Positive fp32 values -> the nearest `dtype` values not below them (no code then exceeds its range)."""
    rounded = values.to(dtype)
    low = rounded.float() < values
    if low.any():
        bits = rounded.view(torch.int16 if rounded.element_size() == 2 else torch.int32)
        bits[low] += 1  # positive floats: the next bit pattern is the next larger value
    return rounded


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


def _plane_zeros(
    scale: torch.Tensor, target: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros (z_lo, z_hi) per group for two planes, their sum nearest `target` after rounding to `dtype`.

    The kernel adds −8·S' (plane 0) and −128·S' (plane 1) by itself, so the zeros must sum to
    target = 136·S' − c0·S' (or 136·S + O). Two splittings keep one zero an exact power-of-two
    multiple of S' (no rounding) and put the rest in the other: (target − 128·S', 128·S') and
    (8·S', target − 8·S'); the one whose rounded sum errs least wins, group by group.
    """
    s = scale.double()
    t = target.double()
    candidates = []
    for fixed_lo, fixed_hi in ((None, 128.0), (8.0, None)):
        lo = s * fixed_lo if fixed_lo is not None else t - s * fixed_hi
        hi = s * fixed_hi if fixed_hi is not None else t - s * fixed_lo
        lo_r, hi_r = lo.to(dtype), hi.to(dtype)
        candidates.append((lo_r, hi_r, (lo_r.double() + hi_r.double() - t).abs()))
    (lo_a, hi_a, err_a), (lo_b, hi_b, err_b) = candidates
    first = err_a <= err_b
    return torch.where(first, lo_a, lo_b), torch.where(first, hi_a, hi_b)


def zero_target(
    scales: torch.Tensor, offsets: torch.Tensor | None, code_offset: int | None, bits: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(stored scales S' in `dtype`, target zero sum Z* in float64 [N, G], code of zero error c_ref).

    w' − w = (S' − S)·(c − c_ref) + (Z' − Z*) where Z' is the sum of the stored zeros and
    Z* = P·S' + O − (S' − S)·c_ref, P = 8 (one plane) or 136 (two). c_ref = c0 for O = −c0·S (then
    Z* = (P − c0)·S', a multiple of S'), else the middle code 2^(bits−1).
    """
    stored = scales.to(dtype)
    new, old = stored.double(), scales.double()
    planes = 1 if bits <= 4 else 2
    base = 8.0 if planes == 1 else 136.0
    if code_offset is not None:
        return stored, (base - code_offset) * new, code_offset
    reference_code = 2 ** (bits - 1)
    return stored, base * new + offsets.double() - (new - old) * reference_code, reference_code


def int4_from_codes(
    codes: torch.Tensor,
    scales: torch.Tensor,
    offsets: torch.Tensor | None,
    group_size: int,
    bits: int,
    code_offset: int | None = None,
    dtype: torch.dtype = kernels.FAST_DTYPE,
) -> Int4Weight:
    """w = S·c + O group-wise (codes c [N, K] in [0, 2^bits), S and O fp32 [N, K/g]) -> Int4Weight.

    Give either `offsets` O (free) or `code_offset` c0 (O = −c0·S). bits ≤ 4: one plane; ≤ 8: two.
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"codes of {bits} bits do not fit two int4 planes")
    k = codes.shape[1]
    stored_scale, target, _ = zero_target(scales, offsets, code_offset, bits, dtype)
    if bits <= 4:
        packed = kernels.pack_int4_codes(codes)
        return Int4Weight(packed, kernels.scale_zeros_tensor(stored_scale, target.to(dtype), dtype), group_size, 1, k)
    zero_lo, zero_hi = _plane_zeros(stored_scale.float(), target, dtype)
    scale_hi = (stored_scale.float() * 16.0).to(dtype)  # a power-of-two multiple: exact
    packed = kernels.pack_int4_codes(torch.cat([codes & 0x0F, codes >> 4], dim=1))
    scale_zeros = kernels.scale_zeros_tensor(
        torch.cat([stored_scale, scale_hi], dim=1), torch.cat([zero_lo, zero_hi], dim=1), dtype
    )
    return Int4Weight(packed, scale_zeros, group_size, 2, k)

"""GGUF tensors -> the CPU kernels' layouts, block by block, without dense fp32 weights in between.

Every block format handled here is affine in an unsigned code c per group of g columns:

    w = S·c + O          S, O fp32 per (row, group); c ∈ [0, 2^b)

| format | block | c (bits)            | S          | O               | g  | kernel layout       |
|--------|-------|---------------------|------------|-----------------|----|---------------------|
| Q4_0   | 32    | q (4)               | d          | −8·d            | 32 | int4, 1 plane       |
| Q4_1   | 32    | q (4)               | d          | m               | 32 | int4, 1 plane       |
| Q4_K   | 256   | q (4)               | d·sc_j     | −dmin·m_j       | 32 | int4, 1 plane       |
| Q5_0   | 32    | q (5)               | d          | −16·d           | 32 | int4, 2 planes      |
| Q5_1   | 32    | q (5)               | d          | m               | 32 | int4, 2 planes      |
| Q5_K   | 256   | q (5)               | d·sc_j     | −dmin·m_j       | 32 | int4, 2 planes      |
| Q8_0   | 32    | q + 128 (8)         | d          | −128·d          | 32 | int4, 2 planes      |
| Q6_K   | 256   | q (6)               | d·sc_j     | −32·d·sc_j      | 16 | int8 per row        |

(d, m, dmin fp16; sc_j, m_j 6-bit in Q4_K/Q5_K, int8 in Q6_K; j the sub-block.) S and O are exact in
fp32 (fp16 times ≤ 8-bit integers), and S·c + O rounded once to fp32 is gguf's own dequantization.

What is exact and what is rounded, compute dtype bf16 (the fast path):
- codes: carried over bit for bit for every int4 format above (5-8-bit codes as two 4-bit planes
  lo = c mod 16 and hi = c div 16, with scales S and 16·S, over the same columns: x' = [x, x]).
- block scales: S rounded to bf16 (8 significant bits; fp16 has 11, d·sc_j up to 17), so each
  weight moves by at most |S' − S|·|c − c_ref| ≤ 2^-8·S·|c − c_ref|.
- zeros: where O = −c0·S (Q4_0, Q5_0, Q8_0) the stored zeros are exact multiples of S' and the
  weights are exactly S'·(c − c0), i.e. w' = bf16(d)·q: relative error ≤ 2^-8 per weight.
  Where O is free (Q4_1, Q4_K, Q5_1, Q5_K) the zero is rounded to bf16 as well: |w' − w| ≤
  2^-8·S·|c − c_ref| + 2^-8·|zero| (c_ref = 2^(b−1), the middle code; `error_bound` gives it).
- Q6_K: its 16-column sub-blocks have their own scales and the int4 kernel's smallest group is 32,
  so no int4 layout holds it exactly; it is dequantized (gguf's values, exact) and requantized to
  int8 per row: |w' − w| ≤ s_n/2, s_n = max_k |w_nk| / 127 rounded up to bf16.
- anything else gguf can dequantize (Q2_K, Q3_K, IQ*) goes the Q6_K way (int8 per row).
With compute dtype fp32 (the exact reference; the kernels' scalar path, 15-30x slower) S and the
zeros are stored unrounded and the int4 formats dequantize bit for bit to gguf's values (tested).
F32 / F16 / BF16 tensors come back as fp32 tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from assisted_backends.quantized import kernels
from assisted_backends.quantized.packing import QuantizedWeight, int4_from_codes, int8_from_float, zero_target

PLAIN_TYPES = ("F32", "F16", "BF16")
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0")


def require_gguf():
    """The `gguf` package, or an ImportError that says how to install it."""
    try:
        import gguf
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("reading GGUF files needs the gguf package: pip install gguf") from error
    return gguf


@dataclass
class AffineCodes:
    """w = S·c + O per group: codes uint8 [N, K], scales / offsets fp32 [N, K/g]."""

    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    group_size: int
    bits: int
    code_offset: int | None  # c0 when O = −c0·S exactly

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K]: S·c + O rounded once (gguf's reference values)."""
        s = self.scales.double().repeat_interleave(self.group_size, dim=1)
        o = self.offsets.double().repeat_interleave(self.group_size, dim=1)
        return (self.codes.double() * s + o).float()

    def permute_rows(self, order: torch.Tensor) -> AffineCodes:
        return AffineCodes(
            self.codes[order], self.scales[order], self.offsets[order], self.group_size, self.bits, self.code_offset
        )


def _half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """fp16 field at byte `start` of each block [B, bytes] -> fp32 [B]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float().reshape(-1)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Bytes [B, n] -> [B, 2n]: the n low nibbles, then the n high ones (ggml's order within a run)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _high_bits(qh: torch.Tensor, count: int) -> torch.Tensor:
    """Little-endian bit field [B, count/8] bytes -> bits [B, count] (bit j of the field at j)."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh[:, :, None] >> shifts) & 1).reshape(qh.shape[0], count)


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins, as fp32 [B, 8]."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([a & 63, (c & 0x0F) | ((a >> 6) << 4)], dim=1)
    mins = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=1)
    return scales.float(), mins.float()


def _decode_blocks(kind: str, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blocks [B, bytes] -> codes [B, block] uint8, scales and offsets [B, groups] fp32."""
    if kind in ("Q4_0", "Q4_1"):
        d = _half(blocks, 0)
        start = 2 if kind == "Q4_0" else 4
        codes = _nibbles(blocks[:, start:])
        offset = -8.0 * d if kind == "Q4_0" else _half(blocks, 2)
        return codes, d[:, None], offset[:, None]
    if kind in ("Q5_0", "Q5_1"):
        d = _half(blocks, 0)
        start = 2 if kind == "Q5_0" else 4
        codes = _nibbles(blocks[:, start + 4 :]) | (_high_bits(blocks[:, start : start + 4], 32) << 4)
        offset = -16.0 * d if kind == "Q5_0" else _half(blocks, 2)
        return codes, d[:, None], offset[:, None]
    if kind == "Q8_0":
        d = _half(blocks, 0)
        codes = (blocks[:, 2:].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        return codes, d[:, None], (-128.0 * d)[:, None]
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _half(blocks, 0), _half(blocks, 2)
        sc, mn = _k_scale_min(blocks[:, 4:16])
        qs = blocks[:, -128:].reshape(-1, 4, 32)  # four runs of 32 bytes: sub-blocks 2j (low), 2j+1 (high)
        codes = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 256)
        if kind == "Q5_K":
            high = (blocks[:, 16:48][:, None, :] >> torch.arange(8, dtype=torch.uint8)[None, :, None]) & 1
            codes = codes | (high.reshape(-1, 256) << 4)  # sub-block j's high bits: bit j of qh[i]
        return codes, d[:, None] * sc, -(dmin[:, None] * mn)
    if kind == "Q6_K":
        low = blocks[:, :128].reshape(-1, 2, 64)  # halves of 128 values: low nibbles, then high nibbles
        low = torch.stack([low & 0x0F, low >> 4], dim=2).reshape(-1, 256)
        high = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]
        codes = low | ((high & 3).reshape(-1, 256) << 4)
        sc = blocks[:, 192:208].contiguous().view(torch.int8).float()
        scale = _half(blocks, 208)[:, None] * sc
        return codes, scale, -32.0 * scale
    raise NotImplementedError(f"no block decoder for {kind}")


_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q8_0": 8, "Q6_K": 6}
_GROUP = {"Q4_K": 32, "Q5_K": 32, "Q6_K": 16}
_CODE_OFFSET = {"Q4_0": 8, "Q5_0": 16, "Q8_0": 128, "Q6_K": 32}


def affine_codes(kind: str, data: np.ndarray | torch.Tensor, shape: tuple[int, int]) -> AffineCodes:
    """Decode a [N, K] tensor of GGUF `kind` (raw bytes, [N, row bytes]) into codes, scales, offsets."""
    gguf = require_gguf()
    quant_type = gguf.GGMLQuantizationType[kind]
    block, block_bytes = gguf.GGML_QUANT_SIZES[quant_type]
    n, k = shape
    raw = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True)) if isinstance(data, np.ndarray) else data
    blocks = raw.reshape(n * (k // block), block_bytes)
    codes, scales, offsets = _decode_blocks(kind, blocks)
    group = _GROUP.get(kind, block)
    return AffineCodes(
        codes.reshape(n, k).contiguous(),
        scales.reshape(n, k // group).contiguous(),
        offsets.reshape(n, k // group).contiguous(),
        group,
        _BITS[kind],
        _CODE_OFFSET.get(kind),
    )


def plain_tensor(kind: str, data: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """F32 / F16 / BF16 data -> an fp32 tensor of `shape` (HF order)."""
    array = np.asarray(data)
    if kind == "BF16":
        as_int = torch.from_numpy(array.view(np.int16).copy()).reshape(shape)
        return as_int.view(torch.bfloat16).float()
    dtype = {"F32": np.float32, "F16": np.float16}[kind]
    return torch.from_numpy(array.view(dtype).astype(np.float32)).reshape(shape)


def dequantize_reference(kind: str, data: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    """gguf.quants' own dequantization of a [N, K] tensor, fp32."""
    gguf = require_gguf()
    values = gguf.quants.dequantize(np.asarray(data), gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(shape)


def kernel_layout(kind: str, shape: tuple[int, int]) -> str:
    """Which stored form a [N, K] tensor of `kind` gets: "int4", "int8" or "dense" (fp32), by format and shape."""
    n, k = shape
    if kind in PLAIN_TYPES:
        return "dense"
    if kind in INT4_TYPES and kernels.int4_supported(n, k, 32):
        return "int4"
    if kernels.int8_supported(k):
        return "int8"
    return "dense"


def repack(
    kind: str,
    data: np.ndarray,
    shape: tuple[int, int],
    dtype: torch.dtype = kernels.FAST_DTYPE,
    row_order: torch.Tensor | None = None,
) -> QuantizedWeight | torch.Tensor:
    """A GGUF [N, K] weight in the kernel layout `kernel_layout` picks (rows reordered by `row_order`).

    int4: codes verbatim, scales / zeros rounded to `dtype` (module docstring). int8: gguf's exact
    dequantization requantized per row. dense: gguf's exact dequantization (fp32).
    """
    chosen = kernel_layout(kind, shape)
    if chosen == "int4":
        codes = affine_codes(kind, data, shape)
        if row_order is not None:
            codes = codes.permute_rows(row_order)
        offsets = None if codes.code_offset is not None else codes.offsets
        return int4_from_codes(
            codes.codes, codes.scales, offsets, codes.group_size, codes.bits, codes.code_offset, dtype
        )
    dense = plain_tensor(kind, data, shape) if kind in PLAIN_TYPES else dequantize_reference(kind, data, shape)
    if row_order is not None:
        dense = dense[row_order]
    return int8_from_float(dense, dtype) if chosen == "int8" else dense


def error_bound(codes: AffineCodes, dtype: torch.dtype) -> torch.Tensor:
    """Per-weight bound [N, K] on |int4 repack − gguf| for compute dtype `dtype` (see `zero_target`).

    |S' − S|·|c − c_ref| (scale rounding) + |Z' − Z*| (zero rounding: none for O = −c0·S; else half an
    ulp of the one rounded zero) + the fp32 roundings of the planes and of gguf's own value.
    """
    unit = torch.finfo(dtype).eps / 2  # unit roundoff: 2^-8 for bf16, 2^-24 for fp32
    offsets = None if codes.code_offset is not None else codes.offsets
    _, target, reference_code = zero_target(codes.scales, offsets, codes.code_offset, codes.bits, dtype)
    planes = 1 if codes.bits <= 4 else 2
    s = codes.scales.double()
    if codes.code_offset is not None:
        zero_part = torch.zeros_like(s)
    else:
        rounded = target if planes == 1 else target - 128.0 * s.to(dtype).double()
        zero_part = unit * rounded.abs()
    expand = lambda t: t.repeat_interleave(codes.group_size, dim=1)  # noqa: E731
    c = codes.codes.double()
    scale_part = unit * expand(s.abs()) * (c - reference_code).abs()
    magnitude = c * expand(s.abs()) + expand(codes.offsets.double().abs() + 136.0 * s.abs())
    return (scale_part + expand(zero_part) + 2.0**-22 * magnitude).float()

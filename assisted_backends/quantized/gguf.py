"""GGUF tensors -> the CPU kernels' layouts, block by block, without dense fp32 weights in between.

Every block format handled here is, per group of g columns, a scale times a signed integer plus a zero:

    w = S·v + Z          S, Z fp32 per (row, group); v a signed integer of b bits

| format | block | v                          | b  | S      | Z                 | g   | kernel layout  |
|--------|-------|----------------------------|----|--------|-------------------|-----|----------------|
| Q4_0   | 32    | q − 8                      | 4  | d      | 0                 | 32  | int4, 1 plane  |
| Q4_1   | 32    | q − 8                      | 4  | d      | m + 8·d           | 32  | int4, 1 plane  |
| Q4_K   | 256   | q − 8                      | 4  | d·sc_j | 8·d·sc_j − dmin·m_j | 32 | int4, 1 plane |
| Q5_0   | 32    | q − 16                     | 5  | d      | 0                 | 32  | int4, 2 planes |
| Q5_1   | 32    | q − 16                     | 5  | d      | m + 16·d          | 32  | int4, 2 planes |
| Q5_K   | 256   | q − 16                     | 5  | d·sc_j | 16·d·sc_j − dmin·m_j | 32 | int4, 2 planes |
| Q8_0   | 32    | q                          | 8  | d      | 0                 | 32  | int4, 2 planes |
| Q6_K   | 256   | sc_j·(q − 32) (j: 16 cols) | 13 | d      | 0                 | 256 | int4, 4 planes |

(q the stored code; d, m, dmin fp16; sc_j, m_j 6-bit in Q4_K/Q5_K, int8 in Q6_K; j the sub-block.)
S, Z and S·v + Z are exact in fp32 except Z for Q4_1 / Q5_1 / Q4_K / Q5_K when its two terms'
exponents lie far apart (not seen in the files here), and S·v + Z rounded once is gguf's own
dequantization (gguf.quants.dequantize), value for value.

A value of b bits is stored as P = ceil(b/4) int4 planes over the same columns (its two's
complement nibbles; `packing.int4_from_values`); the kernel runs on x' = [x, …, x] (P·K columns).
Q6_K's 16-column sub-blocks cannot have their own scale in a kernel group (≥ 32), so its sub-scales
move into the values (v = sc_j·(q − 32), 13 bits) under the super-block scale d: 4 planes, group 256.

What is exact and what is rounded with compute dtype bf16 (the fast path):
- v: carried over exactly, every format above.
- S: rounded to bf16 (8 significant bits; fp16 d has 11, d·sc_j up to 17): |S' − S| ≤ 2^-8·S.
- Z: 0 stays exactly 0 (Q4_0, Q5_0, Q8_0, Q6_K: then w' = bf16(S)·v, relative error ≤ 2^-8 per
  weight); otherwise rounded to bf16: |Z' − Z| ≤ 2^-8·|Z|.
- so |w' − w| ≤ 2^-8·(S·|v| + |Z|) (+ fp32 rounding), `error_bound`; tested against gguf.quants.
With compute dtype fp32 (the exact reference; the kernels' scalar path, many times slower) S and Z are
stored unrounded and the weights equal gguf's values (tested, the sign of zero aside).
Memory: int4 planes cost P/2 bytes a weight plus 2·P·2 bytes per group: Q4_* about 1.1x their file
size, Q5_* / Q8_0 about 1.8x / 1.2x, Q6_K 2.4x (4 planes for 6.56 bits). `compact=("Q6_K",)` trades
Q6_K's exactness for 1 byte a weight (int8 per row from gguf's exact values, |w' − w| ≤ s_n/2).
Other formats gguf can dequantize (Q2_K, Q3_K, IQ*) are dequantized exactly and requantized to int8
per row (|w' − w| ≤ s_n/2, s_n = max_k |w_nk| / 127 rounded up); F32 / F16 / BF16 stay fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from assisted_backends.quantized import kernels
from assisted_backends.quantized.gguf_fields import half, high_bits, k_scale_min, nibbles
from assisted_backends.quantized.gguf_header import require_gguf
from assisted_backends.quantized.packing import QuantizedWeight, int4_from_values, int8_from_float, planes_for

PLAIN_TYPES = ("F32", "F16", "BF16")
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0", "Q6_K")


@dataclass
class BlockValues:
    """w = S·v + Z per group: values int16 [N, K], scales fp32 [N, K/g], zeros fp32 [N, K/g] or None (0)."""

    values: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int
    bits: int

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K]: S·v + Z rounded once (gguf's reference values)."""
        s = self.scales.double().repeat_interleave(self.group_size, dim=1)
        out = self.values.double() * s
        if self.zeros is not None:
            out = out + self.zeros.double().repeat_interleave(self.group_size, dim=1)
        return out.float()

    def permute_rows(self, order: torch.Tensor) -> BlockValues:
        zeros = None if self.zeros is None else self.zeros[order]
        return BlockValues(self.values[order], self.scales[order], zeros, self.group_size, self.bits)


def _decode_blocks(kind: str, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Blocks [B, bytes] -> values int16 [B, block], scales and zeros fp32 [B, groups] (zeros None: 0)."""
    if kind in ("Q4_0", "Q4_1"):
        d = half(blocks, 0)[:, None]
        values = nibbles(blocks[:, 2 if kind == "Q4_0" else 4 :]).to(torch.int16) - 8
        return values, d, None if kind == "Q4_0" else half(blocks, 2)[:, None] + 8.0 * d
    if kind in ("Q5_0", "Q5_1"):
        d = half(blocks, 0)[:, None]
        start = 2 if kind == "Q5_0" else 4
        codes = nibbles(blocks[:, start + 4 :]) | (high_bits(blocks[:, start : start + 4], 32) << 4)
        return codes.to(torch.int16) - 16, d, None if kind == "Q5_0" else half(blocks, 2)[:, None] + 16.0 * d
    if kind == "Q8_0":
        return blocks[:, 2:].contiguous().view(torch.int8).to(torch.int16), half(blocks, 0)[:, None], None
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = half(blocks, 0)[:, None], half(blocks, 2)[:, None]
        sc, mn = k_scale_min(blocks[:, 4:16])
        qs = blocks[:, -128:].reshape(-1, 4, 32)  # four runs of 32 bytes: sub-blocks 2j (low), 2j+1 (high)
        codes = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 256)
        middle = 8.0
        if kind == "Q5_K":
            high = (blocks[:, 16:48][:, None, :] >> torch.arange(8, dtype=torch.uint8)[None, :, None]) & 1
            codes = codes | (high.reshape(-1, 256) << 4)  # sub-block j's high bits: bit j of qh[i]
            middle = 16.0
        scale = d * sc
        return codes.to(torch.int16) - int(middle), scale, middle * scale - dmin * mn
    if kind == "Q6_K":
        low = blocks[:, :128].reshape(-1, 2, 64)  # halves of 128 values: low nibbles, then high nibbles
        low = torch.stack([low & 0x0F, low >> 4], dim=2).reshape(-1, 256)
        high = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]
        codes = (low | ((high & 3).reshape(-1, 256) << 4)).to(torch.int16) - 32
        sub_scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.int16)  # [B, 16]
        values = codes * sub_scales.repeat_interleave(16, dim=1)
        return values, half(blocks, 208)[:, None], None
    raise NotImplementedError(f"no block decoder for {kind}")


_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q8_0": 8, "Q6_K": 13}
_GROUP = {"Q4_K": 32, "Q5_K": 32, "Q6_K": 256}


def block_values(kind: str, data: np.ndarray | torch.Tensor, shape: tuple[int, int]) -> BlockValues:
    """Decode a [N, K] tensor of GGUF `kind` (raw bytes, [N, row bytes]) into values, scales, zeros."""
    gguf = require_gguf()
    quant_type = gguf.GGMLQuantizationType[kind]
    block, block_bytes = gguf.GGML_QUANT_SIZES[quant_type]
    n, k = shape
    raw = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True)) if isinstance(data, np.ndarray) else data
    values, scales, zeros = _decode_blocks(kind, raw.reshape(n * (k // block), block_bytes))
    group = _GROUP.get(kind, block)
    return BlockValues(
        values.reshape(n, k).contiguous(),
        scales.reshape(n, k // group).contiguous(),
        None if zeros is None else zeros.reshape(n, k // group).contiguous(),
        group,
        _BITS[kind],
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


def kernel_layout(kind: str, shape: tuple[int, int], compact: tuple[str, ...] = ()) -> str:
    """Which stored form a [N, K] tensor of `kind` gets: "int4", "int8" or "dense" (fp32), by format and shape.

    Formats named in `compact` go to int8 per row instead of their exact int4 planes (Q6_K: 1 byte
    a weight instead of 2, at |w' − w| ≤ s_n/2).
    """
    n, k = shape
    if kind in PLAIN_TYPES:
        return "dense"
    if kind in INT4_TYPES and kind not in compact and kernels.int4_supported(n, k, _GROUP.get(kind, 32)):
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
    compact: tuple[str, ...] = (),
) -> QuantizedWeight | torch.Tensor:
    """A GGUF [N, K] weight in the kernel layout `kernel_layout` picks (rows reordered by `row_order`).

    int4: codes verbatim, scales / zeros rounded to `dtype` (module docstring). int8: gguf's exact
    dequantization requantized per row. dense: gguf's exact dequantization (fp32).
    """
    chosen = kernel_layout(kind, shape, compact)
    if chosen == "int4":
        decoded = block_values(kind, data, shape)
        if row_order is not None:
            decoded = decoded.permute_rows(row_order)
        return int4_from_values(decoded.values, decoded.scales, decoded.zeros, decoded.group_size, decoded.bits, dtype)
    dense = plain_tensor(kind, data, shape) if kind in PLAIN_TYPES else dequantize_reference(kind, data, shape)
    if row_order is not None:
        dense = dense[row_order]
    return int8_from_float(dense, dtype) if chosen == "int8" else dense


def error_bound(decoded: BlockValues, dtype: torch.dtype) -> torch.Tensor:
    """Per-weight bound [N, K] on |int4 repack − gguf| for compute dtype `dtype`.

    u·(S·|v| + |Z|) with u the unit roundoff of `dtype` (scale and zero rounding), plus the fp32
    roundings of the planes (partial sums up to 16^(P−1)·8·S) and of gguf's own value.
    """
    unit = torch.finfo(dtype).eps / 2  # 2^-8 for bf16, 2^-24 for fp32
    expand = lambda t: t.double().abs().repeat_interleave(decoded.group_size, dim=1)  # noqa: E731
    s = expand(decoded.scales)
    z = expand(decoded.zeros) if decoded.zeros is not None else torch.zeros_like(s)
    v = decoded.values.double().abs()
    partial = 8.0 * 16 ** (planes_for(decoded.bits) - 1) * s
    return (unit * (s * v + z) + 2.0**-23 * (s * v + z + partial)).float()

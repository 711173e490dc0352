"""GGUF block formats in the layout of the package's own kernels (`csrc/block_kernels.cpp`), and their reference.

Every format is stored as small integers v per (row n, column k) in groups of G columns, with

    w[n, k] = S[n, g] · v[n, k] + Z[n, g],    S = d[n, g // sb] · sc[n, g],  Z = dmin[n, g // sb] · mn[n, g]

(d, dmin fp16 per super-block of `sb` groups; sc, mn int8 per group, 1 where absent; Z = 0 without dmin):

| format | bits stored | G  | sb | v                | S        | Z              |
|--------|-------------|----|----|------------------|----------|----------------|
| Q4_0   | 4           | 32 | 1  | q − 8            | d        | 0              |
| Q4_1   | 4           | 32 | 1  | q                | d        | m              |
| Q4_K   | 4           | 32 | 8  | q                | d · sc_j | −dmin · m_j    |
| Q5_0   | 5           | 32 | 1  | q − 16           | d        | 0              |
| Q5_1   | 5           | 32 | 1  | q                | d        | m              |
| Q5_K   | 5           | 32 | 8  | q                | d · sc_j | −dmin · m_j    |
| Q8_0   | 8           | 32 | 1  | q                | d        | 0              |
| Q6_K   | 6           | 16 | 16 | q − 32           | d · sc_j | 0              |

Nothing is rounded: the file's fp16 and 6/8-bit fields are kept as they are, so S and Z are exact in fp32 and
S·v + Z rounded once is gguf's value. 4-bit codes cost half a byte a weight, 5-bit (Q5_0, Q5_1, Q5_K: the nibbles
as 4-bit codes store them and a plane of fifth bits, 64 bytes a group of 16 rows x 32 columns) 0.625, 6-bit (Q6_K:
two 16-column groups stored as one 32-column group of nibbles and a plane of high bit pairs, 128 bytes) 0.75, 8-bit
(Q8_0) one byte: every format about its file's size. `widened` gives a 5- or 6-bit weight the 8-bit layout (the
same v, S and Z: the same outputs bit for bit; the layout before LAYOUT_VERSION 2 (Q5_0), 3 (Q6_K), 4 (Q5_1,
Q5_K)). Rows are padded to tiles of 16; the kernel's byte order is in the C++ source's header.

`reference_linear` is the kernel's formula in plain PyTorch (the same integer sums, the same fp32 operations
in the same order): the kernel must equal it bit for bit on every instruction set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from assisted_backends.native import extension
from assisted_backends.quantized.gguf_fields import high_bits, k_scale_min, nibbles
from assisted_backends.quantized.gguf_header import require_gguf
from assisted_backends.quantized.rounding import round_up_to

LAYOUT_VERSION = 4  # bump when the stored layout changes (it names cached weights); 2: Q5_0 in 5 bits; 3: Q6_K in 6;
# 4: Q5_1 and Q5_K in 5
TILE = 16
BLOCK = 32  # activation quantization block
_UNIT_BYTES = {4: 256, 5: 320, 6: 384}  # bytes of a stored unit of 32 columns x 16 rows (8 bits: one group, G·16)
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0", "Q6_K")


@dataclass
class BlockWeight:
    """W [N, K] in the kernels' tiled layout (module docstring). Tensors: codes uint8 [T, groups, bytes],
    d / dmin fp16 [T, supers, 16], sc / mn int8 [T, groups, 16]; dmin, sc, mn may be None."""

    format: ClassVar[str] = "blocks"
    kernel: ClassVar[str] = "blocks"
    planes: ClassVar[int] = 1
    compute_dtype: ClassVar[torch.dtype] = torch.float32  # fp32 in and out (activations quantized inside)

    codes: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor | None
    sc: torch.Tensor | None
    mn: torch.Tensor | None
    out_features: int
    in_features: int
    bits: int
    group: int
    sb: int
    offset: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def groups(self) -> int:
        return self.in_features // self.group

    @property
    def scheme(self) -> str:
        return f"int{self.bits}"

    @property
    def group_size(self) -> int:
        return self.group

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.codes, self.d, self.dmin, self.sc, self.mn) if t is not None)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The stored tensors by name (absent ones left out)."""
        named = {"codes": self.codes, "d": self.d, "dmin": self.dmin, "sc": self.sc, "mn": self.mn}
        return {name: tensor for name, tensor in named.items() if tensor is not None}

    def meta(self) -> dict[str, int]:
        return {"out_features": self.out_features, "in_features": self.in_features, "bits": self.bits,
                "group": self.group, "sb": self.sb, "offset": self.offset}  # fmt: skip

    @classmethod
    def from_stored(cls, tensors: dict[str, torch.Tensor], meta: dict[str, int]) -> BlockWeight:
        return cls(tensors["codes"], tensors["d"], tensors.get("dmin"), tensors.get("sc"), tensors.get("mn"), **meta)

    def buffers(self) -> dict[str, torch.Tensor]:
        """The stored tensors by buffer name (`block_<name>`)."""
        return {f"block_{name}": tensor for name, tensor in self.tensors().items()}

    @classmethod
    def from_buffers(cls, buffers: dict[str, torch.Tensor], meta: dict[str, int]) -> BlockWeight:
        return cls.from_stored({name.removeprefix("block_"): tensor for name, tensor in buffers.items()}, meta)

    def bind(self, bias: torch.Tensor | None) -> BlockLinear:
        """y = x Wᵀ + b in one op call (it reshapes, adds the bias and casts back to x's dtype)."""
        return BlockLinear(self.kernel_arguments(bias), torch.ops.assisted_backends.block_linear.default)

    def describe(self) -> str:
        return f"{self.bits}-bit blocks of {self.group}, the package's kernels"

    def kernel_arguments(self, bias: torch.Tensor | None = None) -> tuple:
        """The op's arguments after x, up to `isa`: `block_linear(x, *args, isa)`."""
        return (self.codes, self.d, self.dmin, self.sc, self.mn, bias, self.out_features, self.in_features,
                self.bits, self.group, self.sb, self.offset)  # fmt: skip

    def matmul(self, x: torch.Tensor, isa: int | None = None) -> torch.Tensor:
        """y [..., N] = x [..., K] Wᵀ on the package's kernel, in x's dtype (`isa`: None for the process's choice)."""
        isa = extension.forced_isa() if isa is None else isa
        if not torch.compiler.is_compiling() and not extension.available():  # loads the library
            raise RuntimeError(f"the package's kernels do not run here: {extension.status().reason}")
        return torch.ops.assisted_backends.block_linear.default(x, *self.kernel_arguments(), isa)

    # -- reading back (the embedding's row gather, checks, the reference) --------------------------------------

    def values(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """The integers v [R, K] (int32) of rows `index` (all rows when None)."""
        index = torch.arange(self.out_features) if index is None else index.reshape(-1)
        tiles, lanes = index // TILE, index % TILE
        units = self.codes[tiles].reshape(len(index), -1, _UNIT_BYTES.get(self.bits, self.group * TILE))
        codes = units if self.bits == 8 else units[:, :, :256]  # 5 and 6 bits: the nibbles, then a plane
        per_unit = codes.reshape(len(index), codes.shape[1], -1, TILE, 4)  # [R, units, chunks, lane, 4]
        picked = per_unit[torch.arange(len(index)), :, :, lanes]  # [R, units, chunks, 4]
        if self.bits == 8:
            return picked.reshape(len(index), self.in_features).to(torch.int32) - 128
        halves = torch.stack([picked & 0x0F, picked >> 4], dim=2)  # [R, units, 2, 4, 4]
        values = halves.reshape(len(index), self.in_features).to(torch.int32)
        if self.bits == 5:
            values = values | (_fifth_bits(units[:, :, 256:], lanes) << 4)
        if self.bits == 6:
            values = values | (_high_pairs(units[:, :, 256:], lanes) << 4)
        return values - self.offset

    def scales_zeros(self, index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """S and Z [R, groups] in fp32 (exact products of the stored fields), Z None when absent."""
        index = torch.arange(self.out_features) if index is None else index.reshape(-1)
        tiles, lanes = index // TILE, index % TILE

        def expand(field: torch.Tensor, multiplier: torch.Tensor | None) -> torch.Tensor:
            per_super = field[tiles, :, lanes].float()  # [R, supers]
            out = per_super.repeat_interleave(self.sb, dim=1)
            return out if multiplier is None else out * multiplier[tiles, :, lanes].float()

        zeros = None if self.dmin is None else expand(self.dmin, self.mn)
        return expand(self.d, self.sc), zeros

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Dequantized fp32 rows [R, K]: S·v + Z rounded once (gguf's values)."""
        scales, zeros = self.scales_zeros(index)
        weights = self.values(index).double() * scales.double().repeat_interleave(self.group, dim=1)
        if zeros is not None:
            weights = weights + zeros.double().repeat_interleave(self.group, dim=1)
        return weights.float()


@dataclass(frozen=True)
class BlockLinear:
    """`BlockWeight.bind`: the op and its arguments gathered once (attribute lookups on a module cost more than the
    op's own checks); the instruction set is the process's choice at each call."""

    arguments: tuple
    op: object

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, *self.arguments, extension.forced_isa())


# -- from a GGUF tensor's raw blocks --------------------------------------------------------------------------


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    return blocks[:, start : start + 2].contiguous().view(torch.float16)  # [B, 1]


def _negated(half: torch.Tensor) -> torch.Tensor:
    return (half.view(torch.int16) ^ torch.tensor(-32768, dtype=torch.int16)).view(torch.float16)


@dataclass
class _Parts:
    """One format's blocks decoded: stored codes [B, block] (q for 4-, 5-, 6-bit, v + 128 for 8), fields per block."""

    codes: torch.Tensor
    d: torch.Tensor  # fp16 [B, supers per block]
    dmin: torch.Tensor | None
    sc: torch.Tensor | None  # int8 [B, groups per block]
    mn: torch.Tensor | None
    bits: int
    group: int
    sb: int
    offset: int


def _as_stored_bytes(values: torch.Tensor) -> torch.Tensor:
    """Signed 8-bit values -> the stored byte v + 128."""
    return (values.to(torch.int16) + 128).to(torch.uint8)


def _five_bit_codes(blocks: torch.Tensor, start: int) -> torch.Tensor:
    return nibbles(blocks[:, start + 4 :]) | (high_bits(blocks[:, start : start + 4], 32) << 4)


def _decode(kind: str, blocks: torch.Tensor) -> _Parts:
    """Raw blocks [B, bytes] of `kind` -> `_Parts` (module docstring's table)."""
    if kind == "Q4_0":
        return _Parts(nibbles(blocks[:, 2:]), _f16(blocks, 0), None, None, None, 4, 32, 1, 8)
    if kind == "Q4_1":
        return _Parts(nibbles(blocks[:, 4:]), _f16(blocks, 0), _f16(blocks, 2), None, None, 4, 32, 1, 0)
    if kind in ("Q4_K", "Q5_K"):
        sc, mn = k_scale_min(blocks[:, 4:16])
        qs = blocks[:, -128:].reshape(-1, 4, 32)
        codes = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 256)
        dmin = _negated(_f16(blocks, 2))
        if kind == "Q4_K":
            return _Parts(codes, _f16(blocks, 0), dmin, sc.to(torch.int8), mn.to(torch.int8), 4, 32, 8, 0)
        high = (blocks[:, 16:48][:, None, :] >> torch.arange(8, dtype=torch.uint8)[None, :, None]) & 1
        codes = codes | (high.reshape(-1, 256) << 4)
        return _Parts(codes, _f16(blocks, 0), dmin, sc.to(torch.int8), mn.to(torch.int8), 5, 32, 8, 0)
    if kind == "Q5_0":
        return _Parts(_five_bit_codes(blocks, 2), _f16(blocks, 0), None, None, None, 5, 32, 1, 16)
    if kind == "Q5_1":
        return _Parts(_five_bit_codes(blocks, 4), _f16(blocks, 0), _f16(blocks, 2), None, None, 5, 32, 1, 0)
    if kind == "Q8_0":
        values = blocks[:, 2:].contiguous().view(torch.int8)
        return _Parts(_as_stored_bytes(values), _f16(blocks, 0), None, None, None, 8, 32, 1, 0)
    if kind == "Q6_K":
        low = blocks[:, :128].reshape(-1, 2, 64)
        low = torch.stack([low & 0x0F, low >> 4], dim=2).reshape(-1, 256)
        high = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]
        codes = low | ((high & 3).reshape(-1, 256) << 4)  # q ∈ [0, 63]; v = q − 32
        sub_scales = blocks[:, 192:208].contiguous().view(torch.int8)
        return _Parts(codes, _f16(blocks, 208), None, sub_scales, None, 6, 16, 16, 32)
    raise NotImplementedError(f"no block layout for {kind}")


def supported(kind: str, shape: tuple[int, int]) -> bool:
    """Whether a [N, K] tensor of `kind` goes to the package's kernels (K a multiple of its block)."""
    if kind not in BLOCK_TYPES:
        return False
    block = 256 if kind.endswith("_K") else 32
    return shape[1] > 0 and shape[1] % block == 0 and shape[0] > 0


def _tiled(per_row: torch.Tensor, rows: int) -> torch.Tensor:
    """[N, F] per-row fields -> [T, F, 16] (rows padded with zeros to whole tiles)."""
    padded = torch.zeros(rows, per_row.shape[1], dtype=per_row.dtype)
    padded[: per_row.shape[0]] = per_row
    return padded.view(rows // TILE, TILE, -1).transpose(1, 2).contiguous()


def _untiled(field: torch.Tensor, rows: int) -> torch.Tensor:
    """`_tiled`'s inverse: [T, F, 16] -> the first `rows` rows [rows, F]."""
    return field.transpose(1, 2).reshape(-1, field.shape[1])[:rows]


def from_parts(codes: torch.Tensor, d, dmin, sc, mn, bits: int, group: int, sb: int, offset: int) -> BlockWeight:
    """Per-row stored codes [N, K] (uint8) and fields [N, supers] / [N, groups] -> the tiled `BlockWeight`."""
    n, k = codes.shape
    rows = -(-n // TILE) * TILE
    groups = k // group
    padded = torch.zeros(rows, k, dtype=torch.uint8)
    padded[:n] = codes
    units = groups // 2 if bits == 6 else groups  # 6 bits: a pair of 16-column groups stored as one of 32
    if bits == 8:
        tiled = padded.view(rows // TILE, TILE, groups, group // 4, 4).permute(0, 2, 3, 1, 4)
    else:
        halves = (padded & 0x0F).view(rows // TILE, TILE, units, 2, 4, 4)  # [T, lane, unit, half, chunk, j]
        tiled = (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4)
    packed = tiled.reshape(rows // TILE, units, -1)
    if bits == 5:
        packed = torch.cat([packed, _plane(padded, groups)], dim=2)
    if bits == 6:
        packed = torch.cat([packed, _pair_plane(padded, units)], dim=2).view(rows // TILE, groups, -1)
    packed = packed.contiguous()
    optional = lambda field: None if field is None else _tiled(field, rows)  # noqa: E731
    fields = (_tiled(d, rows), optional(dmin), optional(sc), optional(mn))
    return BlockWeight(packed, *fields, n, k, bits, group, sb, offset)


_BIT_WEIGHTS = torch.tensor([1 << b for b in range(8)], dtype=torch.int32)


def _plane(padded: torch.Tensor, groups: int) -> torch.Tensor:
    """5-bit codes [rows, K] -> the plane of fifth bits [T, groups, 64]: mask c (8 bytes, little-endian) holds in
    bit i = 4·lane + j the fifth bit of column 16·(c // 4) + 4·(c % 4) + j of row `lane` (the byte order of the
    nibbles' chunk c, low nibbles for c < 4, high ones for c ≥ 4)."""
    rows = padded.shape[0]
    high = ((padded >> 4) & 1).view(rows // TILE, TILE, groups, 2, 4, 4)  # [T, lane, g, half, chunk, j]
    bits = high.permute(0, 2, 3, 4, 1, 5).reshape(rows // TILE, groups, 64, 8).to(torch.int32)  # i = 4·lane + j
    return (bits * _BIT_WEIGHTS).sum(dim=-1).to(torch.uint8)


def _pair_plane(padded: torch.Tensor, units: int) -> torch.Tensor:
    """6-bit codes [rows, K] -> the plane of high bit pairs [T, units, 128]: byte 64·h + i (i = 4·lane + j) holds in
    bits 2c, 2c + 1 bits 4-5 of q at column 16·h + 4·c + j of row `lane` (the nibbles' chunk c, half h)."""
    rows = padded.shape[0]
    high = ((padded >> 4) & 3).view(rows // TILE, TILE, units, 2, 4, 4).to(torch.int32)  # [T, lane, u, h, c, j]
    shifted = high << (2 * torch.arange(4, dtype=torch.int32)).view(4, 1)
    return shifted.sum(dim=4).permute(0, 2, 3, 1, 4).reshape(rows // TILE, units, 128).to(torch.uint8)


def _high_pairs(plane: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
    """Planes [R, units, 128] and each row's lane -> bits 4-5 of q [R, K] (int32), in column order."""
    r, units = plane.shape[0], plane.shape[1]
    picked = plane.reshape(r, units, 2, TILE, 4)[torch.arange(r), :, :, lanes].to(torch.int32)  # [R, u, h, j]
    pairs = (picked[:, :, :, None, :] >> (2 * torch.arange(4, dtype=torch.int32)).view(4, 1)) & 3  # [R, u, h, c, j]
    return pairs.reshape(r, units * 32)


def _fifth_bits(plane: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
    """Planes [R, groups, 64] and each row's lane -> its fifth bits [R, K] (int32), in column order."""
    r, groups = plane.shape[0], plane.shape[1]
    bits = (plane[..., None].to(torch.int32) >> torch.arange(8, dtype=torch.int32)) & 1  # [R, groups, 64, 8]
    bits = bits.reshape(r, groups, 8, TILE, 4)[torch.arange(r), :, :, lanes]  # [R, groups, c, 4]
    return bits.reshape(r, groups * 32)


def widened(weight: BlockWeight) -> BlockWeight:
    """A 5- or 6-bit weight in the 8-bit layout (u = v + 128, offset 0): the same integers, scales and zeros, so the
    same outputs bit for bit, at about one byte a weight (the layout before the planes)."""
    if weight.bits not in (5, 6):
        raise ValueError(f"weight: widened takes a 5- or 6-bit weight, got {weight.bits}-bit; pass a Q5_0 or Q6_K "
                         "BlockWeight")  # fmt: skip
    codes = (weight.values() + 128).to(torch.uint8)
    fields = (weight.d, weight.dmin, weight.sc, weight.mn)
    d, dmin, sc, mn = (None if field is None else _untiled(field, weight.out_features) for field in fields)
    return from_parts(codes, d, dmin, sc, mn, 8, weight.group, weight.sb, 0)


_CHUNK_BYTES = 4 << 20  # raw bytes repacked at a time: a large table's temporaries stay this size, not its own


def from_gguf(kind: str, data, shape: tuple[int, int], row_order: torch.Tensor | None = None) -> BlockWeight:
    """A GGUF [N, K] tensor of `kind` (raw bytes [N, row bytes]: an array, or anything that gives rows for an index
    array, such as a reader of the file) in the kernels' layout, rows reordered by `row_order`. Repacked a band of
    whole tiles at a time (about `_CHUNK_BYTES` of the file): tiles are independent, so the result is the same bytes
    as one pass over the whole tensor, and the temporaries stay the size of a band."""
    gguf = require_gguf()
    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    n, k = shape
    row_bytes = k // block * block_bytes
    if isinstance(data, (np.ndarray, torch.Tensor)):
        data = data.reshape(n, row_bytes)
    band = max(TILE, _CHUNK_BYTES // max(row_bytes, 1) // TILE * TILE)
    order = None if row_order is None else row_order.numpy()
    out: BlockWeight | None = None
    for start in range(0, n, band):
        stop = min(n, start + band)
        rows = np.arange(start, stop) if order is None else order[start:stop]
        piece = _band(kind, data, rows, k, block, block_bytes)
        if out is None and stop == n:
            return piece
        if out is None:
            out = _empty_like_rows(piece, n)
        tile = start // TILE
        for name, tensor in piece.tensors().items():
            getattr(out, name)[tile : tile + tensor.shape[0]] = tensor
    return out


def _band(kind: str, data, rows: np.ndarray, k: int, block: int, block_bytes: int) -> BlockWeight:
    """Rows `rows` of the file's tensor as a `BlockWeight` of len(rows) rows."""
    if isinstance(data, torch.Tensor):
        raw = data[torch.from_numpy(rows)]
    else:
        raw = torch.from_numpy(np.ascontiguousarray(data[rows], dtype=np.uint8))
    count = len(rows)
    parts = _decode(kind, raw.reshape(count * (k // block), block_bytes))
    del raw
    per_row = lambda t: None if t is None else t.reshape(count, -1)  # noqa: E731
    fields = [per_row(parts.codes.to(torch.uint8)), per_row(parts.d), per_row(parts.dmin), per_row(parts.sc),
              per_row(parts.mn)]  # fmt: skip
    return from_parts(*fields, parts.bits, parts.group, parts.sb, parts.offset)


def _empty_like_rows(piece: BlockWeight, rows: int) -> BlockWeight:
    """An uninitialised `BlockWeight` shaped as `piece` but of `rows` rows (tiles filled band by band)."""
    tiles = -(-rows // TILE)
    empty = lambda t: None if t is None else torch.empty((tiles, *t.shape[1:]), dtype=t.dtype)  # noqa: E731
    return BlockWeight(empty(piece.codes), empty(piece.d), empty(piece.dmin), empty(piece.sc), empty(piece.mn), rows,
                       piece.in_features, piece.bits, piece.group, piece.sb, piece.offset)  # fmt: skip


# -- from float weights (a model quantized here: `quantize_model`) ----------------------------------------------

_HALF_MAX = 65504.0


def from_float(weight: torch.Tensor, bits: int) -> BlockWeight | None:
    """W [N, K] quantized in groups of 32: bits 8 as Q8_0 (v = round(w / d), d = max|w| / 127), bits 4 as Q4_1
    (q = round((w − m) / d), d = (max − min) / 15, m = min); d and m fp16. None when K % 32 != 0 or a scale
    would leave fp16's range (the caller keeps PyTorch's kernels for that layer)."""
    weight = weight.detach().float()
    n, k = weight.shape
    if k % BLOCK or n == 0:
        return None
    groups = weight.view(n, k // BLOCK, BLOCK)
    tiny = torch.finfo(torch.float16).tiny
    if bits == 8:
        scale = groups.abs().amax(dim=-1) / 127.0
        if scale.max() > _HALF_MAX:
            return None
        d = round_up_to(scale.clamp(min=tiny), torch.float16)
        values = torch.round(groups / d.float()[..., None]).clamp(-127, 127).to(torch.int16).view(n, k)
        return from_parts((values + 128).to(torch.uint8), d, None, None, None, 8, BLOCK, 1, 0)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = (high - low) / 15.0
    if scale.max() > _HALF_MAX or low.abs().max() > _HALF_MAX:
        return None
    d = round_up_to(scale.clamp(min=tiny), torch.float16)
    m = low.to(torch.float16)
    codes = torch.round((groups - m.float()[..., None]) / d.float()[..., None]).clamp(0, 15).to(torch.uint8)
    return from_parts(codes.view(n, k), d, m, None, None, 4, BLOCK, 1, 0)


# -- the formula in plain PyTorch -------------------------------------------------------------------------------


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> q_x int8 [M, K], d_x [M, K/32], z_x = d_x · Σ q_x [M, K/32], Σ q_x per 16 columns [M, K/16].

    d_x = max |x| / 127 per block of 32, q_x = round-half-even(x / d_x) in [−127, 127]. A block holding a NaN or
    an infinity gets d_x = NaN and q_x = 0 (its row's outputs are NaN, as the dense product's are NaN or ±inf);
    a block whose 1 / d_x overflows (max |x| below ~3.7e-37) quantizes to zeros."""
    x = x.float()
    m, k = x.shape
    blocks = x.view(m, k // BLOCK, BLOCK)
    finite = torch.isfinite(blocks).all(dim=-1)
    d = torch.where(finite, blocks.abs().amax(dim=-1) / 127.0, torch.full_like(finite, float("nan"), dtype=x.dtype))
    reciprocal = 1.0 / torch.where(finite & (d != 0), d, torch.ones_like(d))
    inverse = torch.where(finite & (d != 0) & torch.isfinite(reciprocal), reciprocal, torch.zeros_like(d))
    scaled = torch.where(finite[..., None], blocks * inverse[..., None], torch.zeros_like(blocks))
    q = torch.round(scaled).clamp(-127, 127).to(torch.int8).view(m, k)
    sums16 = q.view(m, k // 16, 16).sum(dim=-1, dtype=torch.int32)
    sums32 = sums16.view(m, k // BLOCK, 2).sum(dim=-1)
    return q, d, d * sums32.float(), sums16


def reference_linear(weight: BlockWeight, x: torch.Tensor) -> torch.Tensor:
    """y [M, N] fp32 by the kernel's formula, in the kernel's order of fp32 operations."""
    q, dx, zx, _ = quantize_rows_reference(x)
    m, g = q.shape[0], weight.group
    values = weight.values().double().view(weight.out_features, weight.groups, g)
    sums = torch.einsum("mgk,ngk->mng", q.double().view(m, weight.groups, g), values).float()  # exact integers
    scales, zeros = weight.scales_zeros()
    acc = torch.zeros(m, weight.out_features)
    for group in range(weight.groups):
        block = group * g // BLOCK
        acc = acc + (scales[None, :, group] * dx[:, block, None]) * sums[:, :, group]
        if zeros is not None:
            acc = acc + zeros[None, :, group] * zx[:, block, None]
    return acc

"""Reading rows back out of the int4 kernel's packed layout (for a quantized embedding that shares
its storage with the LM head).

`_convert_weight_to_int4pack_for_cpu` turns codes q [N, K] into uint8 [N, K/2] whose byte order is
an implementation detail of the capability it dispatches to (AVX-512: blocks of 64 rows; AVX2 and
the scalar fallback: 32). What this module relies on, and checks before use:

    rows come in blocks of B (the last block may be shorter: r = min(B, N − n0) rows);
    block n0 occupies bytes [n0·K/2, (n0 + r)·K/2), k-major: column k's r codes sit in r/2 bytes
    at n0·K/2 + k·r/2, lane l = n − n0 at byte `byte[r][l]`, nibble shift `shift[r][l]` (0 or 4).

The per-lane tables are learned by packing one-hot probes (N = r ≤ 64 rows, one column group), the
block size B by trying 64 then 32, and the whole description is accepted only if it reproduces
random matrices of several shapes exactly (`layout()` raises NotImplementedError otherwise, naming
the capability). Everything runs once per process, on a few thousand bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from assisted_backends.quantized.kernels import pack_int4_codes

_BLOCK_CANDIDATES = (64, 32)
_LANE_COUNTS = (16, 32, 48, 64)
_PROBE_COLUMNS = 32


@dataclass(frozen=True)
class Int4Layout:
    """Block size B and, per block height r ∈ {16, 32, 48, 64}, each lane's byte and nibble shift.

    The tables are [5, 64] tensors indexed by (r // 16, lane), −1 where a height has no table, so
    `codes` is branch-free tensor code (torch.compile traces it without graph breaks).
    """

    block_rows: int
    byte: torch.Tensor  # int64 [5, 64]
    shift: torch.Tensor  # int64 [5, 64]

    @property
    def heights(self) -> list[int]:
        return [16 * index for index in range(1, 5) if bool((self.byte[index] >= 0).any())]

    def offsets(self, rows: torch.Tensor, out_features: int, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Byte offsets [R, K] and nibble shifts [R, 1] of the codes of `rows` in a packed [N, K/2]."""
        rows = rows.long()
        start = torch.div(rows, self.block_rows, rounding_mode="floor") * self.block_rows
        height = torch.clamp(out_features - start, max=self.block_rows)
        lane = rows - start
        byte = self.byte[height // 16, lane]
        shift = self.shift[height // 16, lane]
        columns = torch.arange(in_features, dtype=torch.long, device=rows.device)
        offsets = start[:, None] * (in_features // 2) + columns[None, :] * (height[:, None] // 2) + byte[:, None]
        return offsets, shift[:, None]

    def codes(self, packed: torch.Tensor, rows: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
        """Codes q [R, K] (uint8, 0..15) of `rows` of the packed [N, K/2] weight."""
        offsets, shift = self.offsets(rows, out_features, in_features)
        data = packed.reshape(-1)[offsets]
        return (data >> shift.to(torch.uint8)) & 0x0F

    def covers(self, out_features: int) -> bool:
        """Whether every row block of an N-row weight has a lane table."""
        tail = out_features % self.block_rows
        return (tail == 0 or tail in self.heights) and (
            out_features < self.block_rows or self.block_rows in self.heights
        )


def _lane_tables(rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Pack lane-identifying probes for an r-row block and read where each lane's nibble landed
    (None when some lane is not in the first column's bytes: r rows are then not one block)."""
    lanes = torch.arange(rows)
    low = pack_int4_codes((lanes % 16)[:, None].expand(rows, _PROBE_COLUMNS))
    high = pack_int4_codes((lanes // 16)[:, None].expand(rows, _PROBE_COLUMNS))
    first = slice(0, rows // 2)  # column 0's bytes, if the layout is k-major within the block
    byte = torch.full((rows,), -1, dtype=torch.long)
    shift = torch.full((rows,), -1, dtype=torch.long)
    low_bytes, high_bytes = low.reshape(-1)[first].long(), high.reshape(-1)[first].long()
    for position in range(rows // 2):
        for nibble in (0, 4):
            lane = ((low_bytes[position] >> nibble) & 15) + 16 * ((high_bytes[position] >> nibble) & 15)
            byte[lane], shift[lane] = position, nibble
    return None if (byte < 0).any() else (byte, shift)


def _reproduces(candidate: Int4Layout) -> bool:
    generator = torch.Generator().manual_seed(0)
    for n, k in ((176, 64), (80, 96), (16, 32), (256, 32), (112, 64)):
        codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.int32)
        packed = pack_int4_codes(codes)
        if not candidate.covers(n):
            return False
        read = candidate.codes(packed, torch.arange(n), n, k)
        if not torch.equal(read.to(torch.int32), codes):
            return False
    return True


@functools.lru_cache(maxsize=1)
def layout() -> Int4Layout:
    """The validated layout of this process's int4 packer; NotImplementedError if it is not understood."""
    tables = {rows: _lane_tables(rows) for rows in _LANE_COUNTS}
    for block_rows in _BLOCK_CANDIDATES:
        byte = torch.full((5, 64), -1, dtype=torch.long)
        shift = torch.full((5, 64), -1, dtype=torch.long)
        for r in _LANE_COUNTS:
            if r <= block_rows and tables[r] is not None:
                byte[r // 16, :r], shift[r // 16, :r] = tables[r]
        candidate = Int4Layout(block_rows, byte, shift)
        if _reproduces(candidate):
            return candidate
    raise NotImplementedError(
        f"the int4 packed layout of torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}) is not "
        "one this module can read rows from; keep the embedding unshared from the LM head"
    )


def signature() -> str:
    """A short tag naming the packed layout (cache files are only valid for the layout that made them)."""
    found = layout()
    digest = 0
    for value in torch.cat([found.byte.flatten(), found.shift.flatten()]).tolist():
        digest = (digest * 131 + value + 1) % (1 << 61)
    return f"b{found.block_rows}-{digest:016x}"[:20]

"""The bit fields inside GGUF's quantized blocks, unpacked: what both readers of raw blocks share (`gguf`'s exact
decode to w = S·v + Z, `blocks`' repack into the package's kernel layout). Blocks are uint8 [B, bytes], one a row.
"""

from __future__ import annotations

import torch


def half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """fp16 field at byte `start` of each block [B, bytes] -> fp32 [B]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float().reshape(-1)


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Bytes [B, n] -> [B, 2n]: the n low nibbles, then the n high ones (ggml's order within a run)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def high_bits(qh: torch.Tensor, count: int) -> torch.Tensor:
    """Little-endian bit field [B, count/8] bytes -> bits [B, count] (bit j of the field at j)."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh[:, :, None] >> shifts) & 1).reshape(qh.shape[0], count)


def k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins, as fp32 [B, 8]."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([a & 63, (c & 0x0F) | ((a >> 6) << 4)], dim=1)
    mins = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=1)
    return scales.float(), mins.float()

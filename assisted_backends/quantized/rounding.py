"""Scales rounded up to the dtype that stores them, so that no code computed against the stored scale exceeds its
range (`packing`'s int8 rows, `blocks`' fp16 block scales)."""

from __future__ import annotations

import torch


def round_up_to(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Positive fp32 values -> the nearest `dtype` values not below them (no code then exceeds its range)."""
    rounded = values.to(dtype)
    low = rounded.float() < values
    if low.any():
        bits = rounded.view(torch.int16 if rounded.element_size() == 2 else torch.int32)
        bits[low] += 1  # positive floats: the next bit pattern is the next larger value
    return rounded

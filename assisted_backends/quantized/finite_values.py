"""Refuse a `.gguf` tensor whose values no model computes with: NaN, infinity, or a magnitude beyond 2^32.

llama.cpp validates row data for NaN and infinity; a flipped byte or a broken conversion puts them in a norm, a
float matrix or a block's fp16 scale. A huge finite value (bytes 0x7f7f7f7f: 3.4e38) is as bad: the first sums
overflow to infinity and the logits turn NaN. A NaN in a key that a verify pass masks then leaks into the rows
before it (NaN + -inf is NaN), so assisted decoding would stop equalling plain decoding on such a file. Trained
weights stay within a few hundred (fp16 checkpoints within 65,504): 2^32 (`LIMIT`) leaves seven orders of magnitude.
Every weight is checked once, as it is repacked on the first load (the cached weights were checked then): the float
tensors whole, the block formats through their scales (their codes are integers).
"""

from __future__ import annotations

import dataclasses

import torch

from assisted_backends.quantized.file_checks import GGUFModelError

LIMIT = float(2**32)  # the largest magnitude a weight may have


def _float_parts(weight: object) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for each floating-point tensor a repacked weight holds (the tensor itself if it is one)."""
    if isinstance(weight, torch.Tensor):
        return [("values", weight)] if weight.is_floating_point() else []
    if dataclasses.is_dataclass(weight):
        items = [(field.name, getattr(weight, field.name)) for field in dataclasses.fields(weight)]
    else:
        items = list(vars(weight).items())
    return [(name, value) for name, value in items if isinstance(value, torch.Tensor) and value.is_floating_point()]


def check_finite(path, name: str, weight: object) -> None:
    """Raise `GGUFModelError` (one line naming the file and the tensor) when `weight` holds a NaN, an infinity or a
    magnitude beyond `LIMIT`."""
    for part, tensor in _float_parts(weight):
        bad = ~(tensor.float().abs() <= LIMIT)  # NaN compares False: counted as bad (fp32: 2^32 is inf in fp16)
        if bool(bad.any()):
            what = "values" if part == "values" else f"block {part} (scales)"
            raise GGUFModelError(path, name, f"{int(bad.sum())} of its {what} are NaN, infinite or beyond "
                                             f"±2^32 (no trained weight is; fp32 sums overflow on them)")  # fmt: skip

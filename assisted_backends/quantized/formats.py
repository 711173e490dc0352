"""The weight formats by name (`weights.py`'s table): the class that rebuilds a layer's or a cache entry's weight."""

from __future__ import annotations

from assisted_backends.quantized.blocks import BlockWeight
from assisted_backends.quantized.packing import Int4Weight, Int8Weight
from assisted_backends.quantized.weights import LinearWeight

FORMATS: dict[str, type[LinearWeight]] = {cls.format: cls for cls in (BlockWeight, Int8Weight, Int4Weight)}


def format_class(name: str) -> type[LinearWeight]:
    """The class of format `name` (a cache entry's "scheme")."""
    if name not in FORMATS:
        raise ValueError(f"unknown quantized weight format {name!r}; known: {sorted(FORMATS)}")
    return FORMATS[name]

"""A `.gguf` file's metadata and tensor table, read in milliseconds and without torch (the command line's checks
before anything loads). Arrays (the tokenizer's 50-260k strings) are skipped and kept as their length only;
`gguf.GGUFReader` builds an object per string and takes seconds on the same files.

Layout (GGUF v2/v3, little-endian): magic `GGUF`, version u32, tensor count u64, key-value count u64; each
key-value: a string key, a u32 value type, the value; each tensor: a string name, u32 dimensions, u64 sizes, u32
type, u64 offset from the data start (the end of the table, aligned to `general.alignment`, default 32).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]
    kind: int  # a GGMLQuantizationType value
    offset: int  # absolute, in bytes

    @property
    def elements(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass(frozen=True)
class GGUFMeta:
    values: dict  # scalars and strings; an array as {"length": n}
    tensors: list[GGUFTensor]
    size: int  # the file's bytes

    def data_end(self) -> int:
        """Where the last tensor's data ends (needs the `gguf` package's block sizes)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        end = 0
        for tensor in self.tensors:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.kind)]
            end = max(end, tensor.offset + tensor.elements // block * block_bytes)
        return end


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> str:
        length = self.take("Q")
        if self.at + length > len(self.data):
            raise struct.error(f"a string of {length} bytes runs past the end of the file")
        text = self.data[self.at : self.at + length].decode("utf-8", errors="replace")
        self.at += length
        return text

    def value(self, kind: int):
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.take("IQ")
            if item in SCALARS:
                self.at += count * struct.calcsize("<" + SCALARS[item])
            else:
                for _ in range(count):
                    self.value(item)
            return {"length": count}
        raise ValueError(f"unknown GGUF value type {kind}")


def read_meta(path: str | Path) -> GGUFMeta:
    """The metadata and tensor table of a GGUF file (mapped, not read whole); ValueError or struct.error when it
    is not one or is cut inside its header."""
    size = Path(path).stat().st_size
    if size < 24:
        raise ValueError(f"{size} bytes, shorter than a GGUF header")
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _parse(data, size)


def _parse(data, size: int) -> GGUFMeta:
    cursor = _Cursor(data)
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic at its start")
    cursor.at = 4
    version, tensor_count, kv_count = cursor.take("IQQ")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (2 or 3 are read)")
    values = {}
    for _ in range(kv_count):
        key = cursor.string()
        values[key] = cursor.value(cursor.take("I"))
    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = cursor.take("I")
        shape = struct.unpack_from(f"<{dims}Q", data, cursor.at)
        cursor.at += 8 * dims
        kind, offset = cursor.take("IQ")
        table.append((name, tuple(reversed(shape)), kind, offset))
    alignment = int(values.get("general.alignment", 32))
    start = (cursor.at + alignment - 1) // alignment * alignment
    tensors = [GGUFTensor(name, shape, kind, start + offset) for name, shape, kind, offset in table]
    return GGUFMeta(values, tensors, size)

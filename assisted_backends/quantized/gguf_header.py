"""A GGUF file's metadata and tensor table, read in well under a second.

`gguf.GGUFReader` builds a numpy view for every string of every metadata array: 13-18 s for Gemma 3's
262,144-token vocabulary on these machines. This reader walks the same bytes once, keeps scalars and
short arrays, and for long string arrays keeps only where they are (`strings(key)` reads one on
demand). Tensor data stays in the file: `tensor_bytes(info)` is a read-only memmap slice.

Layout (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64, key/value count
u64; key/values (key: u64 length + UTF-8; value: u32 type + payload; arrays: u32 element type, u64
count, elements); then per tensor: name, u32 n_dims, u64 dims (fastest-moving first), u32 ggml type,
u64 offset into the data section, which starts at the next multiple of `general.alignment` (32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9
_KEEP_STRINGS = 64  # string arrays up to this length are decoded eagerly (merges / tokens are not)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: GGUF name, shape in torch order ([rows, columns] for a matrix), ggml type name."""

    name: str
    shape: tuple[int, ...]
    kind: str
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass
class GGUFHeader:
    path: Path
    metadata: dict[str, object]
    tensors: dict[str, TensorInfo]
    _string_arrays: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (offset, count)
    _blob: np.memmap | None = None

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    def array_length(self, key: str) -> int | None:
        """Element count of a metadata array (also for the long string arrays kept unread)."""
        if key in self._string_arrays:
            return self._string_arrays[key][1]
        value = self.metadata.get(key)
        return len(value) if isinstance(value, (list, np.ndarray)) else None

    def strings(self, key: str) -> list[str]:
        """A long string array, read now."""
        if key not in self._string_arrays:
            value = self.metadata[key]
            return list(value)
        offset, count = self._string_arrays[key]
        data = memoryview(self._data())
        unpack = struct.Struct("<Q").unpack_from
        out = []
        for _ in range(count):
            (length,) = unpack(data, offset)
            out.append(str(data[offset + 8 : offset + 8 + length], "utf-8", errors="replace"))
            offset += 8 + length
        return out

    def tensor_bytes(self, info: TensorInfo) -> np.ndarray:
        """Raw bytes of one tensor (a read-only view of the file), shaped [rows, row bytes] for matrices."""
        flat = self._data()[info.offset : info.offset + info.nbytes]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return flat.reshape(rows, -1)

    def _data(self) -> np.memmap:
        if self._blob is None:
            self._blob = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._blob


def _string(data: memoryview, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    return str(data[offset + 8 : offset + 8 + length], "utf-8", errors="replace"), offset + 8 + length


def _skip_strings(data: memoryview, offset: int, count: int) -> int:
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        offset += 8 + unpack(data, offset)[0]
    return offset


def _value(data: memoryview, offset: int, kind: int, key: str, strings: dict) -> tuple[object, int]:
    if kind == _STRING:
        return _string(data, offset)
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack_from(fmt, data, offset)[0], offset + struct.calcsize(fmt)
    if kind != _ARRAY:
        raise ValueError(f"GGUF metadata {key!r}: unknown value type {kind}")
    element, count = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if element == _STRING:
        if count <= _KEEP_STRINGS:
            values = []
            for _ in range(count):
                text, offset = _string(data, offset)
                values.append(text)
            return values, offset
        strings[key] = (offset, count)
        return None, _skip_strings(data, offset, count)
    if element == _ARRAY:
        raise ValueError(f"GGUF metadata {key!r}: nested arrays are not supported")
    dtype = np.dtype(_NUMPY[element])
    end = offset + dtype.itemsize * count
    return np.frombuffer(data[offset:end], dtype=dtype).copy(), end


def read_header(path: str | Path) -> GGUFHeader:
    """Metadata and tensor table of a GGUF file (tensor data untouched)."""
    from assisted_backends.quantized.gguf import require_gguf

    gguf = require_gguf()
    path = Path(path)
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    data = memoryview(blob)
    if bytes(data[:4]) != _MAGIC:
        raise ValueError(f"{path} is not a GGUF file (no 'GGUF' magic)")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    offset = 24
    metadata: dict[str, object] = {}
    strings: dict[str, tuple[int, int]] = {}
    for _ in range(kv_count):
        key, offset = _string(data, offset)
        (kind,) = struct.unpack_from("<I", data, offset)
        metadata[key], offset = _value(data, offset + 4, kind, key, strings)
    table = []
    for _ in range(tensor_count):
        name, offset = _string(data, offset)
        (dims,) = struct.unpack_from("<I", data, offset)
        shape = struct.unpack_from(f"<{dims}Q", data, offset + 4)
        kind, relative = struct.unpack_from("<IQ", data, offset + 4 + 8 * dims)
        offset += 4 + 8 * dims + 12
        table.append((name, tuple(reversed(shape)), kind, relative))
    alignment = int(metadata.get("general.alignment", 32))
    start = (offset + alignment - 1) // alignment * alignment
    tensors = {}
    for name, shape, kind, relative in table:
        quant = gguf.GGMLQuantizationType(kind)
        block, block_bytes = gguf.GGML_QUANT_SIZES[quant]
        nbytes = int(np.prod(shape)) // block * block_bytes
        tensors[name] = TensorInfo(name, shape, quant.name, start + relative, nbytes)
    return GGUFHeader(path, metadata, tensors, strings, blob)

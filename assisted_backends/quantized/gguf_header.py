"""The package's one GGUF header reader: a file's metadata and tensor table in milliseconds, without torch.

Every reader of a `.gguf` header uses it: the command line's checks before anything loads (`startup.model_files`),
the truncation check before a loader meets a file (`loading.files.check_complete`), and the quantized loader
(`quantized.model`, `quantized.hf_config`). `gguf.GGUFReader` builds a numpy view for every string of every
metadata array: 13-18 s for Gemma 3's 262,144-token vocabulary on these machines. This reader walks the same
bytes once, keeps scalars and short arrays, and for long string arrays keeps only where they are
(`strings(key)` reads one on demand). Tensor data stays in the file: `tensor_bytes(info)` is a read-only memmap
slice. Imports: numpy, and the `gguf` package for its block sizes (no torch).

Layout (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64, key/value count
u64; key/values (key: u64 length + UTF-8; value: u32 type + payload; arrays: u32 element type, u64
count, elements); then per tensor: name, u32 n_dims, u64 dims (fastest-moving first), u32 ggml type,
u64 offset into the data section, which starts at the next multiple of `general.alignment` (32).

Tensor data follows the table: each tensor's data starts where the one listed before it ends, padded to the
alignment, as llama.cpp requires (`gguf_init_from_file`); a tensor whose data overlaps another's or leaves a gap
(an offset or a ggml type changed after writing: the byte size no longer fits the slot) is refused here. A type
relabelled to another of the same byte size fits its slot and cannot be told from the file. The tokenizer's
metadata is checked here too (every route builds the tokenizer from it, the command line before the model): a
non-empty token list, merges of strings, token types and scores one per token, special token ids inside the list.

Whatever is wrong with a header (no magic, another version, cut short, a field past the file's end) raises
`GGUFFormatError`, one `ValueError` whose `reason` says what, without the path (callers that name the file
themselves put the reason in their own one-line message).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_MAGIC = b"GGUF"
_HEADER_BYTES = 24  # magic, version, tensor count, key/value count
_MAX_DIMS = 8  # ggml has 4; anything above means the table is not a tensor table
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


class GGUFFormatError(ValueError):
    """A file whose GGUF header cannot be read: `reason` says why (no path); str() names the file too."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def require_gguf():
    """The `gguf` package, or an ImportError that says how to install it."""
    try:
        import gguf
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("reading GGUF files needs the gguf package: pip install gguf") from error
    return gguf


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: GGUF name, shape in torch order ([rows, columns] for a matrix), ggml type name."""

    name: str
    shape: tuple[int, ...]
    kind: str
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def elements(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass
class GGUFHeader:
    """Metadata (scalars, strings, short arrays; a long string array as its place only) and the tensor table."""

    path: Path
    metadata: dict[str, object]
    tensors: dict[str, TensorInfo]
    _string_arrays: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (offset, count)
    _blob: np.memmap | None = None

    @property
    def architecture(self) -> str:
        """`general.architecture`; `GGUFFormatError` where it is absent or not a name."""
        value = self.metadata.get("general.architecture")
        if not isinstance(value, str) or not value.strip() or not value.isprintable():
            shown = "absent" if value is None else f"{type(value).__name__} {ascii(value)[:60]}"
            raise GGUFFormatError(self.path, f"general.architecture is {shown}, not the name of an architecture")
        return value

    @property
    def size(self) -> int:
        """The file's bytes."""
        return len(self._data())

    def data_end(self) -> int:
        """Where the last tensor's data ends (beyond `size`: the file is cut short)."""
        return max((info.offset + info.nbytes for info in self.tensors.values()), default=0)

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


class _Cut(Exception):
    """Raised inside the walk; `read_header` turns it into a `GGUFFormatError` naming the file."""


def _string(data: memoryview, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    end = offset + 8 + length
    if end > len(data):
        raise _Cut(f"a string of {length} bytes at byte {offset} runs past the end of the file")
    return str(data[offset + 8 : end], "utf-8", errors="replace"), end


def _skip_strings(data: memoryview, offset: int, count: int) -> int:
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        offset += 8 + unpack(data, offset)[0]
    if offset > len(data):
        raise _Cut(f"a string array of {count} entries runs past the end of the file")
    return offset


def _value(data: memoryview, offset: int, kind: int, key: str, strings: dict) -> tuple[object, int]:
    if kind == _STRING:
        return _string(data, offset)
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack_from(fmt, data, offset)[0], offset + struct.calcsize(fmt)
    if kind != _ARRAY:
        raise _Cut(f"metadata {key!r}: unknown value type {kind}")
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
        raise _Cut(f"metadata {key!r}: nested arrays are not supported")
    if element not in _NUMPY:
        raise _Cut(f"metadata {key!r}: unknown array element type {element}")
    dtype = np.dtype(_NUMPY[element])
    end = offset + dtype.itemsize * count
    if end > len(data):
        raise _Cut(f"metadata {key!r}: an array of {count} values runs past the end of the file")
    return np.frombuffer(data[offset:end], dtype=dtype).copy(), end


def _shown(value: object) -> str:
    text = ascii(value.tolist() if isinstance(value, np.ndarray) else value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def _check_tokenizer(metadata: dict, strings: dict) -> None:
    """The tokenizer's metadata of the kinds every tokenizer builder indexes by (`_Cut` otherwise): the token list
    non-empty strings, merges strings, token types and scores one per token, special token ids inside the list."""
    for name in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        if name in metadata and not isinstance(metadata[name], str):
            raise _Cut(f"{name} is {_shown(metadata[name])}, not a string")
    key = "tokenizer.ggml.tokens"
    if key not in metadata:
        return
    value = metadata[key]
    count = strings[key][1] if key in strings else len(value) if isinstance(value, list) else 0
    if count == 0:
        raise _Cut(f"{key} holds no token strings (an empty vocabulary): {_shown(value)}")
    merges = metadata.get("tokenizer.ggml.merges", [])
    if "tokenizer.ggml.merges" not in strings and not isinstance(merges, list):
        raise _Cut(f"tokenizer.ggml.merges is {_shown(merges)}, not a list of strings")
    if metadata.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.merges" not in metadata:
        raise _Cut("tokenizer.ggml.merges is absent: a byte-level BPE tokenizer (model 'gpt2') needs its merges")
    for name, kind in (("tokenizer.ggml.token_type", "i"), ("tokenizer.ggml.scores", "f")):
        per_token = metadata.get(name)
        if per_token is not None and not (isinstance(per_token, np.ndarray) and per_token.dtype.kind in kind + "iu"
                                          and len(per_token) == count):  # fmt: skip
            raise _Cut(f"{name} is {_shown(per_token)}, not one number for each of the {count} tokens")
    for name, item in metadata.items():
        if not name.startswith("tokenizer.ggml.") or item is None:
            continue
        if name.endswith("_token_id"):
            whole = isinstance(item, int) and not isinstance(item, bool)
            if not (whole and 0 <= item < count):
                raise _Cut(f"{name} is {_shown(item)}, not the index of one of the {count} tokens")
        elif name.startswith("tokenizer.ggml.add_") and not isinstance(item, bool):
            raise _Cut(f"{name} is {_shown(item)}, not true or false")


def _walk(data: memoryview, gguf) -> tuple[dict, dict, dict]:
    """(metadata, tensors, long string arrays) of a whole header; `_Cut` or struct.error where it breaks."""
    if bytes(data[:4]) != _MAGIC:
        raise _Cut("not a GGUF file (no 'GGUF' magic)")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise _Cut(f"GGUF version {version} is not supported (2 or 3)")
    offset = _HEADER_BYTES
    metadata: dict[str, object] = {}
    strings: dict[str, tuple[int, int]] = {}
    for _ in range(kv_count):
        key, offset = _string(data, offset)
        (kind,) = struct.unpack_from("<I", data, offset)
        metadata[key], offset = _value(data, offset + 4, kind, key, strings)
    _check_tokenizer(metadata, strings)
    table = []
    for _ in range(tensor_count):
        name, offset = _string(data, offset)
        (dims,) = struct.unpack_from("<I", data, offset)
        if dims > _MAX_DIMS:
            raise _Cut(f"tensor {name!r}: {dims} dimensions")
        shape = struct.unpack_from(f"<{dims}Q", data, offset + 4)
        kind, relative = struct.unpack_from("<IQ", data, offset + 4 + 8 * dims)
        offset += 4 + 8 * dims + 12
        table.append((name, tuple(reversed(shape)), kind, relative))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise _Cut(f"general.alignment is {alignment!r}")
    start = (offset + alignment - 1) // alignment * alignment
    tensors = {}
    expected = 0  # where the next tensor's data must start, relative to the data section
    for name, shape, kind, relative in table:
        try:
            quant = gguf.GGMLQuantizationType(kind)
            block, block_bytes = gguf.GGML_QUANT_SIZES[quant]
        except (ValueError, KeyError):
            raise _Cut(f"tensor {name!r}: unknown ggml type {kind}") from None
        if shape and shape[-1] % block:
            raise _Cut(f"tensor {name!r}: rows of {shape[-1]} values, not whole {quant.name} blocks of {block}")
        if name in tensors:
            raise _Cut(f"tensor {name!r} is listed twice")
        count = 1
        for size in shape:
            count *= size
        nbytes = count // block * block_bytes
        if relative != expected:
            where = "overlaps the data before it" if relative < expected else "leaves a gap after the data before it"
            raise _Cut(f"tensor {name!r} ({quant.name} {list(shape)}): its data at byte {start + relative} {where} "
                       f"(byte {start + expected} expected: a tensor's type or offset was changed)")  # fmt: skip
        expected = (relative + nbytes + alignment - 1) // alignment * alignment
        tensors[name] = TensorInfo(name, shape, quant.name, start + relative, nbytes)
    return metadata, tensors, strings


def read_header(path: str | Path) -> GGUFHeader:
    """Metadata and tensor table of a GGUF file (tensor data untouched, the file mapped, not read whole);
    `GGUFFormatError` when it is not one or is cut inside its header."""
    gguf = require_gguf()
    path = Path(path)
    size = path.stat().st_size
    if size < _HEADER_BYTES:
        raise GGUFFormatError(path, f"{size} bytes, shorter than a GGUF header")
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        metadata, tensors, strings = _walk(memoryview(blob), gguf)
    except _Cut as error:
        raise GGUFFormatError(path, str(error)) from None
    except (struct.error, OverflowError) as error:  # a field read past the end of the file
        raise GGUFFormatError(path, f"cut inside its header ({error})") from None
    return GGUFHeader(path, metadata, tensors, strings, blob)

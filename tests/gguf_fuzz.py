"""A seeded GGUF mutator: well-formed tiny Llama files (`quantized_fixtures.write_tiny_llama_gguf`), parsed into
their parts, changed in one place, written back (tests/loading/test_gguf_fuzz.py runs the cases).

`case(seed, folder)` is deterministic in `seed`: the seed picks the base file (Q4_0, Q8_0, a Q4_K mix, F16 and
F32 mixes; tied and untied heads) and one mutation, round robin over the families (header, metadata, tensor
table, dimensions, offsets, truncation, data bytes), with its parameters drawn from `random.Random(seed)`.
A `Case` says what changed (`label`) and whether the file is certainly invalid (`must_fail`: a shape or a count
that disagrees with the config, data that overlaps or runs past the end, a bad magic, version or type); any other
mutation may load (garbage weights are still weights), and must then decode greedily as plain decoding does.

Reproduce one case: `python tests/gguf_fuzz.py SEED OUT.gguf` (prints the label; its base file is left beside it).
"""

from __future__ import annotations

import random
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

STRING, ARRAY = 8, 9
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_INTEGER = (0, 1, 2, 3, 4, 5, 10, 11)
_FLOAT = (6, 12)
#: keys whose value fixes a tensor's shape in the tiny Llama: any other value disagrees with the tensors
SHAPE_KEYS = (
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
)
BASES = {  # name -> (write_tiny_llama_gguf kinds, tied head, tensors rewritten as {role: F16 | F32})
    "q4_0": ("Q4_0", True, {}),
    "q8_0-untied": ("Q8_0", False, {}),
    "q4_k-mix": ({"default": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "token_embd": "Q8_0"}, True, {}),
    "f16-mix-untied": ("Q8_0", False, {"default": "F16", "token_embd": "F32", "attn_k": "Q8_0"}),
    "f32-tied": ("Q8_0", True, {"default": "F32"}),
}
GGML = {"F32": 0, "F16": 1}
HUGE = (2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1)


@dataclass(frozen=True)
class Entry:
    """One metadata key/value: the value's type and its serialized payload (arrays with their header)."""

    key: str
    kind: int
    payload: bytes


@dataclass(frozen=True)
class Tensor:
    """One tensor table row, dims in GGUF order (fastest-moving first); offset relative to the data section."""

    name: str
    dims: tuple[int, ...]
    kind: int
    offset: int


@dataclass(frozen=True)
class GGUF:
    """A file's parts; `tensor_count` / `kv_count` None: the real counts."""

    version: int
    entries: tuple[Entry, ...]
    tensors: tuple[Tensor, ...]
    data: bytes
    magic: bytes = b"GGUF"
    tensor_count: int | None = None
    kv_count: int | None = None

    @property
    def alignment(self) -> int:
        for entry in self.entries:
            if entry.key == "general.alignment" and entry.kind == 4:
                return struct.unpack("<I", entry.payload)[0]
        return 32

    def to_bytes(self) -> bytes:
        out = [self.magic, struct.pack("<I", self.version)]
        out.append(struct.pack("<QQ", _count(self.tensor_count, self.tensors), _count(self.kv_count, self.entries)))
        for entry in self.entries:
            out += [_string(entry.key), struct.pack("<I", entry.kind), entry.payload]
        for tensor in self.tensors:
            out += [_string(tensor.name), struct.pack("<I", len(tensor.dims))]
            out += [struct.pack("<Q", size) for size in tensor.dims] + [struct.pack("<IQ", tensor.kind, tensor.offset)]
        head = b"".join(out)
        pad = -len(head) % self.alignment
        return head + b"\0" * pad + self.data


def _count(forced: int | None, items: tuple) -> int:
    return len(items) if forced is None else forced


def _string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def scalar(kind: int, value: object) -> bytes:
    return struct.pack(_SCALAR[kind], value)


def array(element: int, values: list) -> bytes:
    body = b"".join(_string(v) if element == STRING else scalar(element, v) for v in values)
    return struct.pack("<IQ", element, len(values)) + body


def parse(blob: bytes) -> GGUF:
    """The parts of a well-formed GGUF file (the fixtures' own: no checks)."""
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", blob, 4)
    offset, entries = 24, []
    for _ in range(kv_count):
        key, offset = _read_string(blob, offset)
        (kind,) = struct.unpack_from("<I", blob, offset)
        end = _skip_value(blob, offset + 4, kind)
        entries.append(Entry(key, kind, blob[offset + 4 : end]))
        offset = end
    tensors = []
    for _ in range(tensor_count):
        name, offset = _read_string(blob, offset)
        (n_dims,) = struct.unpack_from("<I", blob, offset)
        dims = struct.unpack_from(f"<{n_dims}Q", blob, offset + 4)
        kind, relative = struct.unpack_from("<IQ", blob, offset + 4 + 8 * n_dims)
        tensors.append(Tensor(name, tuple(dims), kind, relative))
        offset += 4 + 8 * n_dims + 12
    parsed = GGUF(version, tuple(entries), tuple(tensors), b"")
    start = offset + -offset % parsed.alignment
    return replace(parsed, data=blob[start:])


def _read_string(blob: bytes, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, offset)
    return blob[offset + 8 : offset + 8 + length].decode("utf-8"), offset + 8 + length


def _skip_value(blob: bytes, offset: int, kind: int) -> int:
    if kind == STRING:
        return _read_string(blob, offset)[1]
    if kind != ARRAY:
        return offset + struct.calcsize(_SCALAR[kind])
    element, count = struct.unpack_from("<IQ", blob, offset)
    offset += 12
    for _ in range(count):
        offset = _skip_value(blob, offset, element)
    return offset


def tensor_bytes(kind: int, dims: tuple[int, ...]) -> int:
    """Bytes of a tensor of ggml type `kind` (ValueError for a type gguf does not know)."""
    import gguf

    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
    return int(np.prod(dims, dtype=object)) // block * block_bytes


def retype(model: GGUF, roles: dict[str, str]) -> GGUF:
    """The file with the tensors of `roles` (role -> "F16" | "F32", "default" for the rest) dequantized into that
    type, the data section laid out again (aligned)."""
    import gguf

    data, tensors = bytearray(), []
    for tensor in model.tensors:
        size = tensor_bytes(tensor.kind, tensor.dims)
        raw = np.frombuffer(model.data, np.uint8, size, tensor.offset)
        role = tensor.name.split(".")[-2]
        target = roles.get(role, roles.get("default"))
        if target in GGML and GGML[target] != tensor.kind and len(tensor.dims) == 2:
            values = gguf.quants.dequantize(raw.reshape(tensor.dims[1], -1), gguf.GGMLQuantizationType(tensor.kind))
            raw = values.astype(np.float16 if target == "F16" else np.float32).view(np.uint8).reshape(-1)
            tensors.append(replace(tensor, kind=GGML[target], offset=len(data)))
        else:
            tensors.append(replace(tensor, offset=len(data)))
        data += raw.tobytes()
        data += b"\0" * (-len(data) % model.alignment)
    return replace(model, tensors=tuple(tensors), data=bytes(data))


def write_base(name: str, path: Path) -> Path:
    """The well-formed base file `name` (BASES) at `path`."""
    from quantized_fixtures import write_tiny_llama_gguf

    kinds, tied, roles = BASES[name]
    write_tiny_llama_gguf(path, kinds, seed=sorted(BASES).index(name), tied=tied)
    if roles:
        path.write_bytes(retype(parse(path.read_bytes()), roles).to_bytes())
    return path


# --- mutations: (rng, parts, file bytes) -> (new bytes, label, must_fail) ----------------------------------------

Mutation = Callable[[random.Random, GGUF, bytes], tuple[bytes, str, bool]]


def _header(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """The magic, the version, or a count (tensors, key/values): 0, one off, huge."""
    what = rng.choice(["magic", "version", "counts", "counts"])
    if what == "magic":
        magic = rng.choice([b"GGUG", b"FUGG", b"\0\0\0\0", b"ggjt", b"GGML"])
        return replace(model, magic=magic).to_bytes(), f"magic {magic!r}", True
    if what == "version":
        version = rng.choice([0, 1, 2, 4, 2**31, 2**32 - 1])
        return replace(model, version=version).to_bytes(), f"version {version}", version != 2
    which = rng.choice(["tensor_count", "kv_count"])
    real = len(model.tensors if which == "tensor_count" else model.entries)
    value = rng.choice([0, real - 1, real + 1, real * 1000, *HUGE])
    must = not (which == "kv_count" and value == real - 1)  # the last key (tokenizer merges, ids) may be optional
    return replace(model, **{which: value}).to_bytes(), f"{which} {real} -> {value}", must


def _metadata_value(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    numeric = [i for i, e in enumerate(model.entries) if e.kind in _INTEGER + _FLOAT]
    index = rng.choice(numeric)
    entry = model.entries[index]
    (old,) = struct.unpack(_SCALAR[entry.kind], entry.payload)
    if entry.kind in _FLOAT:
        value = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e30, -1e-30])
    else:
        low, high = _bounds(entry.kind)
        value = min(max(rng.choice([0, -1, 1, old * 2, old // 2, old + 1, *HUGE]), low), high)
    changed = replace(entry, payload=scalar(entry.kind, value))
    must = entry.key in SHAPE_KEYS and value != old or entry.key == "llama.block_count" and value > old
    must = must or entry.key == "llama.block_count" and value == 0
    return _with_entry(model, index, changed).to_bytes(), f"{entry.key} {old} -> {value}", must


def _bounds(kind: int) -> tuple[int, int]:
    bits = struct.calcsize(_SCALAR[kind]) * 8
    return (0, 2**bits - 1) if kind in (0, 2, 4, 10) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _metadata_type(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """A value of another type: a string where a number belongs, a float, a bool, an (empty) array, a number where
    a string or a string array belongs."""
    index = rng.randrange(len(model.entries))
    entry = model.entries[index]
    choices = [
        (STRING, _string("256"), "string '256'"),
        (STRING, _string(""), "empty string"),
        (6, scalar(6, 256.5), "float32 256.5"),
        (7, scalar(7, True), "bool true"),
        (ARRAY, array(4, []), "empty uint32 array"),
        (ARRAY, array(4, [256, 256]), "uint32 array [256, 256]"),
        (ARRAY, array(STRING, []), "empty string array"),
        (4, scalar(4, 7), "uint32 7"),
        (11, scalar(11, -5), "int64 -5"),
        (rng.choice([13, 99, 2**32 - 1]), b"\0" * 8, "an unknown value type"),
    ]
    kind, payload, what = rng.choice(choices)
    changed = Entry(entry.key, kind, payload)
    unknown = kind not in _SCALAR and kind not in (STRING, ARRAY)
    must = entry.key in SHAPE_KEYS + ("general.architecture", "llama.block_count") or unknown
    must = must and (kind, payload) != (entry.kind, entry.payload)
    return _with_entry(model, index, changed).to_bytes(), f"{entry.key} ({entry.kind}) -> {what}", must


def _metadata_special(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """The keys a loader leans on: architecture, the token list, token ids; a key removed or repeated."""
    keys = [entry.key for entry in model.entries]
    choice = rng.choice(["architecture", "tokens", "token ids", "remove", "duplicate"])
    if choice == "architecture":
        name = rng.choice(["", "gpt2", "llama4", "no-such-arch", "\u00e9\u00e9", "llama\0"])
        index = keys.index("general.architecture")
        changed = Entry("general.architecture", STRING, _string(name))
        return _with_entry(model, index, changed).to_bytes(), f"general.architecture -> {name!r}", True
    if choice == "tokens":
        count = rng.choice([0, 1, 10, 271, 273])
        index = keys.index("tokenizer.ggml.tokens")
        tokens = [f"t{i}" for i in range(count)]
        changed = Entry("tokenizer.ggml.tokens", ARRAY, array(STRING, tokens))
        return _with_entry(model, index, changed).to_bytes(), f"tokenizer.ggml.tokens: {count} tokens", True
    if choice == "token ids":
        key = rng.choice([k for k in keys if k.endswith("_token_id")])
        value = rng.choice([272, 2**31 - 1, 2**32 - 1])
        changed = Entry(key, 4, scalar(4, value))
        return _with_entry(model, keys.index(key), changed).to_bytes(), f"{key} -> {value}", False
    index = rng.randrange(len(model.entries))
    entries = list(model.entries)
    if choice == "remove":
        removed = entries.pop(index)
        must = removed.key in SHAPE_KEYS + ("general.architecture", "llama.block_count")
        return replace(model, entries=tuple(entries)).to_bytes(), f"{removed.key} removed", must
    entries.insert(index, entries[index])
    return replace(model, entries=tuple(entries)).to_bytes(), f"{entries[index].key} repeated", False


def _with_entry(model: GGUF, index: int, entry: Entry) -> GGUF:
    entries = list(model.entries)
    entries[index] = entry
    return replace(model, entries=tuple(entries))


def _with_tensor(model: GGUF, index: int, tensor: Tensor) -> GGUF:
    tensors = list(model.tensors)
    tensors[index] = tensor
    return replace(model, tensors=tuple(tensors))


def _tensor_name(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    index = rng.randrange(len(model.tensors))
    tensor = model.tensors[index]
    other = rng.choice([t.name for t in model.tensors if t.name != tensor.name])
    name = rng.choice([other, "", "blk.9.attn_q.weight", tensor.name + "x", "blk.-1.attn_q.weight", "\u00ff" * 300])
    must = tensor.name != "output.weight" or name == other  # an untied head renamed away may fall back to tying
    return _with_tensor(model, index, replace(tensor, name=name)).to_bytes(), f"{tensor.name} renamed {name!r}", must


def _tensor_dims(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """One dimension changed, or the dimension count (a dimension dropped, an extra one of size 1 or 2)."""
    index = rng.randrange(len(model.tensors))
    tensor = model.tensors[index]
    dims = list(tensor.dims)
    what = rng.choice(["size", "size", "size", "drop", "extra"])
    if what == "size":
        axis = rng.randrange(len(dims))
        dims[axis] = rng.choice([0, 1, dims[axis] * 2, dims[axis] // 2, dims[axis] + 32, dims[axis] - 32, *HUGE])
        must = dims[axis] != tensor.dims[axis]
    elif what == "drop":
        dims = dims[:-1] if len(dims) > 1 else []
        must = True
    else:
        extra = rng.choice([1, 2])
        dims.append(extra)
        must = extra != 1  # ggml's trailing size-1 dimension is the same tensor
    changed = replace(tensor, dims=tuple(dims))
    return _with_tensor(model, index, changed).to_bytes(), f"{tensor.name} dims {tensor.dims} -> {tuple(dims)}", must


def _tensor_type(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """Another ggml type over the same bytes: certainly bad where the tensor would then run into the next one or past
    the end, or the type is unknown, or its blocks do not tile a row."""
    import gguf

    index = rng.randrange(len(model.tensors))
    tensor = model.tensors[index]
    known = [int(t) for t in gguf.GGMLQuantizationType]
    kind = rng.choice([*known, 4, 5, 99, 2**31, 2**32 - 1])
    if kind == tensor.kind:
        kind = 99
    label = f"{tensor.name} type {tensor.kind} -> {kind}"
    changed = _with_tensor(model, index, replace(tensor, kind=kind))
    if kind not in known or tensor.dims[0] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)][0]:
        return changed.to_bytes(), label, True
    end = tensor.offset + tensor_bytes(kind, tensor.dims)
    limit = min([t.offset for t in model.tensors if t.offset > tensor.offset] + [len(model.data)])
    return changed.to_bytes(), label, end > limit


def relaid(model: GGUF, index: int, tensor: Tensor, fill: bytes = b"") -> GGUF:
    """The file with tensor `index` replaced by `tensor`, its data cut or repeated (then `fill`ed) to the new
    size, and every tensor laid out again, aligned: a structurally sound file (offsets and sizes agree)."""
    data, tensors = bytearray(), []
    for position, old in enumerate(model.tensors):
        raw = model.data[old.offset : old.offset + tensor_bytes(old.kind, old.dims)]
        if position == index:
            size = tensor_bytes(tensor.kind, tensor.dims)
            raw = (fill * size if fill else raw * (size // max(len(raw), 1) + 1))[:size]
            old = tensor
        tensors.append(replace(old, offset=len(data)))
        data += raw
        data += b"\0" * (-len(data) % model.alignment)
    return replace(model, tensors=tuple(tensors), data=bytes(data))


def _tensor_resize(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """A tensor of another shape whose data has that shape's size (the file is sound, its shapes disagree with
    the config): a wider or narrower row, more or fewer rows, another dimension count."""
    import gguf

    index = rng.randrange(len(model.tensors))
    tensor = model.tensors[index]
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor.kind)][0]
    dims = list(tensor.dims)
    axis = rng.randrange(len(dims))
    step = block if axis == 0 else 1
    dims[axis] = rng.choice([dims[axis] * 2, dims[axis] // 2, dims[axis] + step, max(dims[axis] - step, step), step])
    if rng.random() < 0.15:
        dims = [int(np.prod(dims))] if len(dims) > 1 else [dims[0] // 2, 2]
    dims = tuple(dims)
    if dims == tensor.dims:
        dims = (tensor.dims[0] * 2, *tensor.dims[1:])
    fill = rng.choice([b"", b"", b"\0", b"\xff"])
    changed = relaid(model, index, replace(tensor, dims=dims), fill)
    label = f"{tensor.name} dims {tensor.dims} -> {dims}, data resized ({fill.hex() or 'tiled'})"
    return changed.to_bytes(), label, True


def _tensor_retype(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """A tensor stored in another type whose blocks tile its rows, its data resized to match: a sound file (its
    weights are garbage, as a file of that type with those bytes would be)."""
    import gguf

    index = rng.randrange(len(model.tensors))
    tensor = model.tensors[index]
    kinds = [int(t) for t in gguf.GGMLQuantizationType if int(t) != tensor.kind]
    kinds = [k for k in kinds if tensor.dims[0] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(k)][0] == 0]
    kind = rng.choice(kinds)
    fill = rng.choice([b"", b"\0"])
    changed = relaid(model, index, replace(tensor, kind=kind), fill)
    name = gguf.GGMLQuantizationType(kind).name
    return changed.to_bytes(), f"{tensor.name} type {tensor.kind} -> {kind} ({name}), data resized", False


def _tensor_offset(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    index = rng.randrange(len(model.tensors))
    tensor = model.tensors[index]
    other = rng.choice(model.tensors).offset
    offset = rng.choice([0, other, tensor.offset + 1, tensor.offset + 32, tensor.offset - 32, len(model.data), *HUGE])
    offset = offset % 2**64
    size = tensor_bytes(tensor.kind, tensor.dims)
    overlaps = any(
        t.name != tensor.name and offset < t.offset + tensor_bytes(t.kind, t.dims) and t.offset < offset + size
        for t in model.tensors
    )
    must = offset != tensor.offset and (overlaps or offset % model.alignment != 0 or offset + size > len(model.data))
    label = f"{tensor.name} offset {tensor.offset} -> {offset}"
    return _with_tensor(model, index, replace(tensor, offset=offset)).to_bytes(), label, must


def _truncate(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    size = rng.choice([rng.randrange(0, 64), rng.randrange(len(blob) - len(model.data)), rng.randrange(len(blob))])
    end = len(blob) - len(model.data) + max(t.offset + tensor_bytes(t.kind, t.dims) for t in model.tensors)
    return blob[:size], f"cut to {size} of {len(blob)} bytes", size < end


def _data_bytes(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """Bytes of one tensor's data overwritten (0xff in a float or a block scale is a NaN): a valid, odd file."""
    tensor = rng.choice(model.tensors)
    start = len(blob) - len(model.data) + tensor.offset
    size = tensor_bytes(tensor.kind, tensor.dims)
    count = rng.choice([1, 8, 64, size])
    fill = rng.choice([b"\xff", b"\x00", b"\x7f", None])
    out = bytearray(blob)
    for position in rng.sample(range(start, start + size), min(count, size)):
        out[position] = rng.randrange(256) if fill is None else fill[0]
    what = "random" if fill is None else fill.hex()
    return bytes(out), f"{tensor.name}: {min(count, size)} data bytes set to {what}", False


def _header_bytes(rng: random.Random, model: GGUF, blob: bytes) -> tuple[bytes, str, bool]:
    """Raw bytes anywhere in the header (a length, a type, a count): nothing certain about the outcome."""
    head = len(blob) - len(model.data)
    out = bytearray(blob)
    positions = rng.sample(range(4, head), rng.choice([1, 2, 4]))
    for position in positions:
        out[position] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
    return bytes(out), f"header bytes at {sorted(positions)} changed", False


MUTATIONS: dict[str, Mutation] = {
    "header": _header,
    "metadata_value": _metadata_value,
    "metadata_type": _metadata_type,
    "metadata_special": _metadata_special,
    "tensor_name": _tensor_name,
    "tensor_dims": _tensor_dims,
    "tensor_type": _tensor_type,
    "tensor_offset": _tensor_offset,
    "tensor_resize": _tensor_resize,
    "tensor_retype": _tensor_retype,
    "truncate": _truncate,
    "data_bytes": _data_bytes,
    "header_bytes": _header_bytes,
}


@dataclass(frozen=True)
class Case:
    """One fuzz case: its seed, base file, mutation family and label, whether the file is certainly invalid."""

    seed: int
    base: str
    family: str
    label: str
    must_fail: bool
    path: Path

    def __str__(self) -> str:
        certainty = "invalid" if self.must_fail else "may load"
        return f"seed {self.seed} [{self.base}, {self.family}: {self.label}; {certainty}]"


def case(seed: int, folder: Path, bases: dict[str, Path] | None = None) -> Case:
    """Case `seed`: base file and mutation family round robin over the seed, parameters from Random(seed); the
    mutated file is written under `folder` (base files are written there too unless `bases` gives them)."""
    names, families = sorted(BASES), list(MUTATIONS)
    family = families[seed % len(families)]
    base = names[(seed // len(families)) % len(names)]
    source = (bases or {}).get(base) or _base_file(base, folder)
    blob = source.read_bytes()
    data, label, must_fail = MUTATIONS[family](random.Random(seed), parse(blob), blob)
    path = folder / f"case-{seed}.gguf"
    path.write_bytes(data)
    return Case(seed, base, family, label, must_fail, path)


def _base_file(name: str, folder: Path) -> Path:
    path = folder / f"base-{name}.gguf"
    return path if path.is_file() else write_base(name, path)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    made = case(int(sys.argv[1]), Path(sys.argv[2]).parent)
    made.path.replace(sys.argv[2])
    print(replace(made, path=Path(sys.argv[2])))

"""Crafted `.gguf` files: the tiny Llama of `quantized_fixtures.write_tiny_llama_gguf` with its header or tensors
changed as a hostile or damaged download would have them, for the file checks' tests.

`CASES` names each crafted kind (the issue's list: wrong tensor shapes, norms of the wrong length or type, head
counts and sizes that cannot hold, layer and vocabulary counts, overlapping or relabelled tensor data, context and
rotary sizes); `write_crafted(directory, name)` writes that file. A case is a rewrite of the well-formed file:
metadata keys set or removed, tensors replaced by others of another shape or type, or removed, and patches of the
tensor table's bytes (a tensor's offset or ggml type) after writing, which no writer would produce.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from quantized_fixtures import TINY, random_blocks, write_tiny_llama_gguf

BASE_KINDS = {"default": "Q4_0", "token_embd": "Q8_0", "output": "Q8_0"}
_PADDING = "crafted.padding"


@dataclass
class Craft:
    """How a crafted file differs from the well-formed one."""

    metadata: dict[str, object] = field(default_factory=dict)  # key -> value (type as the original's), None: removed
    tensors: dict[str, tuple[tuple[int, ...], str] | None] = field(default_factory=dict)  # name -> (shape, kind)
    offsets: dict[str, str] = field(default_factory=dict)  # tensor -> another tensor whose data offset it takes
    relabel: dict[str, str] = field(default_factory=dict)  # tensor -> ggml type written over its type field
    retyped: dict[str, tuple[object, str]] = field(default_factory=dict)  # key -> (value, GGUFValueType name)
    tied: bool = False
    subject: str = ""  # what the one-line refusal names (a tensor or metadata key)
    cli_subject: str = ""  # what the command line's refusal names where it refuses earlier (its own checks)


H, F, V, HEADS, KV = TINY["hidden"], TINY["intermediate"], TINY["vocab"], TINY["heads"], TINY["kv_heads"]
DH = H // HEADS


def _tensor(name: str, shape: tuple[int, ...], kind: str = "Q4_0") -> Craft:
    """`name` replaced by a tensor of `shape` and `kind`; the refusal names it."""
    return Craft(subject=name, tensors={name: (shape, kind)})


def _meta(subject: str, **values: object) -> Craft:
    """`llama.<key>` metadata set (keys spelled with "__" for "."); the refusal names `llama.<subject>`."""
    return Craft(subject=f"llama.{subject}", metadata={f"llama.{k.replace('__', '.')}": v for k, v in values.items()})


CASES: dict[str, Craft] = {
    "token_embd_wide": _tensor("token_embd.weight", (V, 2 * H), "Q8_0"),
    "token_embd_wide_tied": Craft(subject="token_embd.weight", tensors={"token_embd.weight": ((V, 2 * H), "Q8_0")},
                                  tied=True),  # fmt: skip
    "output_wide": _tensor("output.weight", (V, 2 * H), "Q8_0"),
    "output_rows": _tensor("output.weight", (V - 16, H), "Q8_0"),
    "attn_output_rows_short": _tensor("blk.0.attn_output.weight", (H // 2, H)),
    "attn_output_cols_long": _tensor("blk.1.attn_output.weight", (H, 2 * H)),
    "ffn_gate_rows_short": _tensor("blk.0.ffn_gate.weight", (F // 2, H)),
    "ffn_gate_cols_long": _tensor("blk.0.ffn_gate.weight", (F, 2 * H)),
    "ffn_up_rows_long": _tensor("blk.1.ffn_up.weight", (2 * F, H)),
    "ffn_down_rows_short": _tensor("blk.0.ffn_down.weight", (H // 2, F)),
    "ffn_down_cols_short": _tensor("blk.0.ffn_down.weight", (H, F // 2)),
    "attn_q_rows_short": _tensor("blk.0.attn_q.weight", (H // 2, H)),
    "attn_q_cols_long": _tensor("blk.0.attn_q.weight", (H, 2 * H)),
    "attn_k_rows_long": _tensor("blk.1.attn_k.weight", (2 * KV * DH, H)),
    "attn_v_rows_short": _tensor("blk.0.attn_v.weight", (KV * DH // 2, H)),
    "attn_v_cols_short": _tensor("blk.0.attn_v.weight", (KV * DH, H // 2)),
    "attn_norm_short": _tensor("blk.0.attn_norm.weight", (H // 2,), "F32"),
    "ffn_norm_long": _tensor("blk.1.ffn_norm.weight", (2 * H,), "F32"),
    "output_norm_short": _tensor("output_norm.weight", (H - 32,), "F32"),
    "norm_quantized": _tensor("blk.0.attn_norm.weight", (H,), "Q8_0"),
    "heads_zero": _meta("attention.head_count", attention__head_count=0),
    "kv_heads_zero": _meta("attention.head_count_kv", attention__head_count_kv=0),
    "heads_not_divisible": _meta("attention.head_count_kv", attention__head_count_kv=3),
    "head_size_odd": _meta("attention.key_length", rope__dimension_count=63, attention__key_length=63,
                           attention__value_length=63),  # fmt: skip
    "head_sizes_disagree": _meta("attention.value_length", attention__key_length=DH, attention__value_length=DH // 2),
    "head_size_not_hidden_over_heads": _meta("attention.key_length", attention__key_length=DH // 2,
                                             attention__value_length=DH // 2),  # fmt: skip
    "layers_zero": _meta("block_count", block_count=0),
    "layers_missing": Craft(subject="blk.2.", metadata={"llama.block_count": TINY["layers"] + 1}),
    "layers_fewer_than_tensors": Craft(subject="blk.1.", metadata={"llama.block_count": TINY["layers"] - 1}),
    "tensor_missing": Craft(subject="blk.1.ffn_down.weight", tensors={"blk.1.ffn_down.weight": None}),
    "vocab_empty": Craft(subject="tokenizer.ggml.tokens",
                         metadata={"tokenizer.ggml.tokens": [], "tokenizer.ggml.token_type": []}),  # fmt: skip
    "vocab_disagrees": Craft(subject="token_embd.weight", metadata={"llama.vocab_size": V + 64}),
    # the tensor after the changed one is named: its data no longer starts where the changed one ends
    "data_overlap": Craft(subject="blk.1.ffn_up.weight", offsets={"blk.1.ffn_up.weight": "blk.1.ffn_gate.weight"}),
    "type_relabelled_larger": Craft(subject="blk.0.attn_k.weight", relabel={"blk.0.attn_q.weight": "Q8_0"}),
    "type_relabelled_smaller": Craft(subject="blk.0.ffn_up.weight", relabel={"blk.0.ffn_gate.weight": "Q2_K"}),
    "context_zero": Craft(subject="llama.context_length", metadata={"llama.context_length": 0},
                          cli_subject="0 positions"),  # fmt: skip
    "context_absurd": _meta("context_length", context_length=4_000_000_000),
    "rope_dims_over_head": _meta("rope.dimension_count", rope__dimension_count=2 * DH),
    # what the seeded fuzzer found (tests/loading/test_gguf_fuzz.py): another architecture's name on a Llama file,
    # metadata of the wrong kind, sizes transformers' config refuses
    "architecture_relabelled": Craft(subject="gpt2.block_count", metadata={"general.architecture": "gpt2"}),
    "eps_a_string": Craft(subject="llama.attention.layer_norm_rms_epsilon",
                          retyped={"llama.attention.layer_norm_rms_epsilon": ("tiny", "STRING")}),  # fmt: skip
    "eps_negative": Craft(subject="llama.attention.layer_norm_rms_epsilon",
                          retyped={"llama.attention.layer_norm_rms_epsilon": (-5, "INT64")}),  # fmt: skip
    "rope_base_a_string": Craft(subject="llama.rope.freq_base", retyped={"llama.rope.freq_base": ("256", "STRING")}),
    "bos_id_a_bool": Craft(subject="tokenizer.ggml.bos_token_id",
                           retyped={"tokenizer.ggml.bos_token_id": (True, "BOOL")}),  # fmt: skip
    "eos_id_negative": Craft(subject="tokenizer.ggml.eos_token_id",
                             retyped={"tokenizer.ggml.eos_token_id": (-5, "INT64")}),  # fmt: skip
    "bos_id_past_the_vocabulary": Craft(subject="tokenizer.ggml.bos_token_id",
                                        retyped={"tokenizer.ggml.bos_token_id": (V, "UINT32")}),  # fmt: skip
    "merges_a_number": Craft(subject="tokenizer.ggml.merges", retyped={"tokenizer.ggml.merges": (256.5, "FLOAT32")}),
    "merges_missing": Craft(subject="tokenizer.ggml.merges", metadata={"tokenizer.ggml.merges": None}),
    "tokenizer_model_an_array": Craft(subject="tokenizer.ggml.model",
                                      retyped={"tokenizer.ggml.model": ([256, 256], "ARRAY")}),  # fmt: skip
    "hidden_huge": Craft(subject="metadata", metadata={"llama.embedding_length": 2_147_483_647}),
}


def _tensor_data(shape: tuple[int, ...], kind: str, seed: int) -> np.ndarray:
    if kind in ("F32", "F16"):
        values = 1.0 + 0.1 * np.random.default_rng(seed).standard_normal(shape)
        return values.astype(np.float32 if kind == "F32" else np.float16)
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    data = random_blocks(kind, rows, shape[-1], seed=seed)
    return data.reshape(-1) if len(shape) == 1 else data


def _rewrite(source: Path, target: Path, craft: Craft) -> None:
    """`source` written again as `target` with `craft`'s metadata and tensors."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    architecture = craft.metadata.get("general.architecture", reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(target), str(architecture))
    for key, item in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or (key in craft.metadata and
                                                                        craft.metadata[key] is None):  # fmt: skip
            continue
        if key in craft.retyped:
            value, kind = craft.retyped[key]
            writer.add_key_value(key, value, gguf.GGUFValueType[kind])
            continue
        value = craft.metadata.get(key, item.contents())
        if value == []:  # gguf writes no empty array: one element now, taken out by `_empty_arrays`
            value = [""] if item.types[-1] == gguf.GGUFValueType.STRING else [0]
        main, sub = item.types[0], (item.types[-1] if item.types[0] == gguf.GGUFValueType.ARRAY else None)
        writer.add_key_value(key, value, main, sub)
    for key, value in craft.metadata.items():
        if value is not None and key not in reader.fields:
            writer.add_key_value(key, value, gguf.GGUFValueType.UINT32)
    if any(value == [] for value in craft.metadata.values()):  # room that `_empty_arrays` hands to emptied arrays
        writer.add_key_value(_PADDING, "", gguf.GGUFValueType.STRING)
    seed = 100
    names = [tensor.name for tensor in reader.tensors]
    names += [name for name in craft.tensors if name not in names and craft.tensors[name] is not None]
    existing = {tensor.name: tensor for tensor in reader.tensors}
    for name in names:
        if name in craft.tensors:
            spec = craft.tensors[name]
            if spec is None:
                continue
            shape, kind = spec
            seed += 1
            data = _tensor_data(shape, kind, seed)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[kind])
            continue
        tensor = existing[name]
        writer.add_tensor(name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _patch_table(path: Path, craft: Craft) -> None:
    """Overwrite tensor-table fields in place: data offsets taken from other tensors, ggml types relabelled."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    places, relative = {}, {}
    for tensor in reader.tensors:
        start = int(tensor.field.offset)
        kind_at = start + 8 + len(tensor.name.encode()) + 4 + 8 * len(tensor.shape)
        places[tensor.name] = kind_at
        relative[tensor.name] = struct.unpack_from("<Q", path.read_bytes(), kind_at + 4)[0]
    del reader
    blob = bytearray(path.read_bytes())
    for name, other in craft.offsets.items():
        struct.pack_into("<Q", blob, places[name] + 4, relative[other])
    for name, kind in craft.relabel.items():
        struct.pack_into("<I", blob, places[name], int(gguf.GGMLQuantizationType[kind]))
    path.write_bytes(bytes(blob))


def _empty_arrays(path: Path, keys: list[str]) -> None:
    """Make the one-element arrays `keys` empty, the bytes taken out added to the padding string (every offset
    after the metadata stays where it was)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    cuts = []
    for key in keys:
        item = reader.fields[key]
        count_at = int(item.offset) + 8 + len(key.encode()) + 4 + 4
        first = item.data[0] - (1 if item.types[-1] == gguf.GGUFValueType.STRING else 0)  # a string's length too
        cuts.append((count_at, sum(part.nbytes for part in item.parts[first:])))
    pad = reader.fields[_PADDING]
    pad_length_at = int(pad.offset) + 8 + len(_PADDING.encode()) + 4
    del reader
    blob = bytearray(path.read_bytes())
    removed = sum(size for _, size in cuts)
    struct.pack_into("<Q", blob, pad_length_at, removed)
    blob[pad_length_at + 8 : pad_length_at + 8] = b"-" * removed
    for count_at, size in sorted(cuts, reverse=True):
        struct.pack_into("<Q", blob, count_at, 0)
        del blob[count_at + 8 : count_at + 8 + size]
    path.write_bytes(bytes(blob))


def write_base(directory: Path, tied: bool = False) -> Path:
    """The well-formed tiny Llama the crafted files start from (untied: it has an output.weight)."""
    return write_tiny_llama_gguf(directory / f"base-{'tied' if tied else 'untied'}.gguf", BASE_KINDS, tied=tied)


def write_crafted(directory: Path, name: str) -> Path:
    """The crafted file `name` (a key of `CASES`) in `directory`."""
    craft = CASES[name]
    base = directory / f"base-{'tied' if craft.tied else 'untied'}.gguf"
    if not base.is_file():
        write_base(directory, craft.tied)
    target = directory / f"{name}.gguf"
    _rewrite(base, target, craft)
    empty = [key for key, value in craft.metadata.items() if value == []]
    if empty:
        _empty_arrays(target, empty)
    if craft.offsets or craft.relabel:
        _patch_table(target, craft)
    return target

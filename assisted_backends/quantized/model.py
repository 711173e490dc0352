"""`load_gguf_quantized`: a transformers causal LM straight from a GGUF file's blocks, weights quantized.

First load: read the header (`gguf_header`), build the config the way transformers does
(`hf_config`), make the model with empty weights (accelerate's `init_empty_weights`, buffers such as
rotary frequencies real), map GGUF tensor names to the model's with gguf's own name tables, and put
each tensor in:
- linear weights -> `QuantizedLinear` repacked from the file's blocks (`gguf.repack`: "file" scheme)
  or requantized from gguf's exact dequantization ("int8" / "int4" schemes); transformers'
  per-tensor processing is applied when it is a row permutation (Llama's q/k head interleave),
  which moves quantized rows exactly; anything else is refused (NotImplementedError);
- the input embedding -> `QuantizedEmbedding` over the same kind of table; a tied LM head shares it;
- norms, biases and other small tensors -> fp32, through transformers' processing (Gemma's norm − 1).
The tokenizer comes from transformers' GGUF tokenizer converter (`load_gguf_tokenizer`), built
in a thread while the weights are repacked (first load) or after the model is built (cached load:
started earlier it slows the model's build through the GIL). Config, tokenizer and packed tensors
(one safetensors file per scheme, compute dtype and int4 byte layout) go to the cache (`cache.py`);
later loads read them back. Scheme "dense" gives plain fp32 weights (gguf's dequantization) for
comparisons; not cached.

Measured 2026-11-25 (AMD EPYC, 2 shared cores, load average about 2, fresh processes, after
`import torch, transformers`): SmolLM2-135M Q4_1 (98 MB): first load 5.8 s, cached 2.2 s, weights
97 MiB (1.04x the file). Gemma 3 270M Q4_K_M (253 MB): first load 11.3 s with the tokenizer ready
at 21.9 s (transformers' GGUF tokenizer path reads the file with gguf.GGUFReader, about 18 s of it),
cached 2.3 s (tokenizer 5.7 s), weights 315 MiB (1.30x).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from assisted_backends import hf_compat
from assisted_backends.native import extension
from assisted_backends.native.heap import trim_heap
from assisted_backends.quantized import blocks, cache, gguf, kernels
from assisted_backends.quantized.blocks import BlockWeight
from assisted_backends.quantized.file_checks import GGUFModelError, check_file
from assisted_backends.quantized.finite_values import check_finite
from assisted_backends.quantized.formats import format_class
from assisted_backends.quantized.fusion import SIBLINGS, adjacent, fuse_projections
from assisted_backends.quantized.gguf_header import GGUFHeader, read_header
from assisted_backends.quantized.hf_config import load_config
from assisted_backends.quantized.int4_layout import signature
from assisted_backends.quantized.linear import QuantizedEmbedding, QuantizedLinear, why_not_quantizable
from assisted_backends.quantized.packing import int4_from_float, int8_from_float
from assisted_backends.quantized.weights import LinearWeight

SCHEMES = ("file", "int8", "int4", "dense")
_FORMAT_VERSION = 2  # bump when the repacking of any format changes (it names the cache file)
_MODEL_TYPE_TO_GGUF = {"cohere": "command-r", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3"}


@dataclass
class LoadedGGUF:
    """The model (eval mode), its tokenizer, and how the load went.

    `model`: stepped by the native decoder (one C++ call a forward, `native.decoder_model`) where it covers the
    model, else transformers' modeling on the kernels; `step` says which and why. `reference`: transformers' modeling
    over the same weights (what `model` wraps, or `model` itself). `seconds`: until the model was ready. The
    tokenizer is built in a background thread (on a first load transformers parses the whole GGUF for it);
    `tokenizer` waits for it, and `tokenizer_seconds` says when it was ready (same clock as `seconds`).
    """

    model: nn.Module
    pending_tokenizer: _Background | None
    cache_dir: Path | None
    from_cache: bool
    seconds: float
    report: dict[str, str] = field(default_factory=dict)
    reference: nn.Module | None = None

    @property
    def step(self) -> str:
        """The forward pass `model` runs, and why (`decoder_model.STEP_LINE`, or transformers' modeling: why)."""
        return getattr(self.model, "step_report", "")

    @staticmethod
    def stepped(model: nn.Module, native: bool, kv_cache_dtype: str = "fp32") -> nn.Module:
        """`model` (transformers' modeling on the kernels) stepped natively where covered and `native` asks for it,
        its cache kept in `kv_cache_dtype` (`native.decoder_model.native_model`); else `model`, its `step_report`
        saying why not."""
        from assisted_backends.native.decoder_model import native_model

        if native:
            return native_model(model, kv_cache_dtype).eval()
        model.step_report = "forward pass: transformers' modeling on the kernels (native=False)"
        return model

    @property
    def tokenizer(self):
        return None if self.pending_tokenizer is None else self.pending_tokenizer.result()

    @property
    def tokenizer_seconds(self) -> float | None:
        if self.pending_tokenizer is None:
            return None
        self.pending_tokenizer.result()
        return self.pending_tokenizer.finished - self.pending_tokenizer.started_at

    def weight_bytes(self) -> int:
        """Bytes of all parameters and buffers, each storage counted once."""
        seen, total = set(), 0
        for tensor in list(self.model.parameters()) + list(self.model.buffers()):
            key = tensor.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += tensor.untyped_storage().nbytes()
        return total


@dataclass
class _Plan:
    """What goes where: quantized weights by module path, tied heads, dense tensors by full name."""

    linears: dict[str, LinearWeight] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)  # head module path -> embedding module path
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    report: dict[str, str] = field(default_factory=dict)


def _skeleton(config) -> nn.Module:
    """The model with its parameters on the meta device (buffers real)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, **hf_compat.dtype_kwargs(torch.float32))
    return model.eval()


def _name_map(model: nn.Module, header: GGUFHeader) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by gguf's tensor name tables."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    model_type = _MODEL_TYPE_TO_GGUF.get(model.config.model_type, model.config.model_type)
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == model_type), None)
    if arch is None:
        arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == header.architecture), None)
    if arch is None:
        raise NotImplementedError(f"the installed gguf package has no tensor names for {model_type!r}")
    names = get_tensor_name_map(arch, model.config.num_hidden_layers)
    mapping: dict[str, str] = {}
    for hf_name in model.state_dict().keys():
        stem, dot, suffix = hf_name.rpartition(".")
        parts = stem.split(".")
        for start in range(len(parts)):
            found = names.get_name(".".join(parts[start:]))
            if found is not None:
                mapping.setdefault(f"{found}{dot}{suffix}", hf_name)
                break
    return mapping


def _processor(header: GGUFHeader, config):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=config.to_dict())


def _row_order(processor, gguf_name: str, rows: int) -> torch.Tensor | None:
    """transformers' processing of a [rows, K] weight as a row order (None: unchanged)."""
    probe = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    try:
        result = processor.process(weights=probe.copy(), name=gguf_name, tensor_key_mapping={}, parsed_parameters={})
    except (KeyError, IndexError, TypeError) as error:  # a processor that needs the whole file's tensors (GPT-2)
        raise NotImplementedError(f"transformers' GGUF processing of {gguf_name} needs the whole file "
                                  f"({type(error).__name__}: {error}); not applicable to blocks") from None  # fmt: skip
    moved = np.asarray(result.weights)
    if result.name != gguf_name or moved.shape != probe.shape:
        raise NotImplementedError(
            f"transformers reshapes or renames {gguf_name} when loading; not applicable to blocks"
        )
    order = moved[:, 0]
    if np.array_equal(order, probe[:, 0]):
        return None
    if not np.array_equal(np.sort(order), probe[:, 0]):
        raise NotImplementedError(
            f"transformers changes the values of {gguf_name} when loading, not only its row order"
        )
    return torch.from_numpy(order.astype(np.int64))


class _FileRows:
    """A tensor's raw rows read from the file with `os.pread` into memory of the caller's (`rows[index]`, `all()`),
    not through a mapping: pages of a mapped file count as the process's resident memory while mapped, so repacking
    through one held the whole file resident beside its repacked copy."""

    def __init__(self, header: GGUFHeader, info) -> None:
        self.path, self.offset, self.nbytes = header.path, info.offset, info.nbytes
        self.rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        self.row_bytes = info.nbytes // max(self.rows, 1)

    def _read(self, first: int, count: int) -> np.ndarray:
        out = np.empty((count, self.row_bytes), dtype=np.uint8)
        view, done = memoryview(out).cast("B"), 0
        with open(self.path, "rb", buffering=0) as handle:
            while done < out.nbytes:
                got = os.preadv(handle.fileno(), [view[done:]], self.offset + first * self.row_bytes + done)
                if got <= 0:
                    raise ValueError(f"{self.path}: tensor data cut short at byte {self.offset + done}")
                done += got
        return out

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        """Rows `index` (an integer array): the span they lie in is read, then picked."""
        index = np.asarray(index)
        first = int(index.min())
        span = self._read(first, int(index.max()) - first + 1)
        if index[0] == first and np.array_equal(index, np.arange(first, first + len(index))):
            return span
        return span[index - first]

    def all(self) -> np.ndarray:
        return self._read(0, self.rows)


def _dense(header: GGUFHeader, info, processor=None) -> torch.Tensor:
    """gguf's exact values of a tensor (fp32, torch order), with transformers' processing if given."""
    data = _FileRows(header, info).all()
    if info.kind in gguf.PLAIN_TYPES:
        values = gguf.plain_tensor(info.kind, data, info.shape)
    else:
        values = gguf.dequantize_reference(info.kind, data, info.shape)
    if processor is not None:
        result = processor.process(
            weights=values.numpy().copy(), name=info.name, tensor_key_mapping={}, parsed_parameters={}
        )
        values = torch.from_numpy(np.ascontiguousarray(result.weights, dtype=np.float32)).reshape(info.shape)
    return values


def _uses_blocks(dtype: torch.dtype) -> bool:
    """The "file" scheme keeps each block on the package's kernels where they run; compute dtype fp32 asks for
    the exact fp32 reference instead (PyTorch's kernels on the file's exact weights, activations unquantized)."""
    return dtype != torch.float32 and extension.available()


def _quantized_weight(
    header, info, scheme, group_size, dtype, order, compact
) -> tuple[LinearWeight | torch.Tensor, str]:
    """The stored form of one matrix and a phrase for the report."""
    rows, columns = info.shape
    if scheme == "file" and _uses_blocks(dtype) and blocks.supported(info.kind, info.shape):
        weight = blocks.from_gguf(info.kind, _FileRows(header, info), info.shape, order)
        return weight, f"{info.kind} -> {weight.bits}-bit blocks (exact, the package's kernels)"
    if scheme == "file":
        layout = gguf.kernel_layout(info.kind, info.shape, compact)
        weight = gguf.repack(info.kind, _FileRows(header, info).all(), info.shape, dtype, order, compact)
        if layout == "int4":
            return weight, f"{info.kind} -> int4 x{weight.planes} (codes exact)"
        return weight, f"{info.kind} -> {layout}"
    dense = _dense(header, info)
    if order is not None:
        dense = dense[order]
    if scheme == "dense" or why_not_quantizable(rows, columns, scheme, group_size):
        return dense, f"{info.kind} -> fp32"
    if scheme == "int8":
        return int8_from_float(dense, dtype), f"{info.kind} -> int8 (requantized)"
    return int4_from_float(dense, group_size, dtype), f"{info.kind} -> int4 g{group_size} (requantized)"


def _plan_from_file(model, header, config, scheme, group_size, dtype, compact) -> _Plan:
    plan = _Plan()
    names = _name_map(model, header)
    processor = _processor(header, config)
    embedding = model.get_input_embeddings()
    for info in header.tensors.values():
        hf_name = names.get(info.name)
        if hf_name is None:
            plan.report[info.name] = "not in the model (skipped, as transformers does)"
            continue
        module_path, _, attr = hf_name.rpartition(".")
        module = model.get_submodule(module_path)
        matrix = attr == "weight" and len(info.shape) == 2 and isinstance(module, (nn.Linear, nn.Embedding))
        if matrix and (info.kind not in gguf.PLAIN_TYPES or scheme in ("int8", "int4")):
            if isinstance(module, nn.Embedding) and module is not embedding:
                raise NotImplementedError(f"{hf_name}: only the input embedding can be quantized as an embedding")
            order = _row_order(processor, info.name, info.shape[0])
            weight, note = _quantized_weight(header, info, scheme, group_size, dtype, order, compact)
            check_finite(header.path, info.name, weight)
            trim_heap()  # the repacking's temporaries: freed between the kept tensors, resident until trimmed
            if isinstance(weight, torch.Tensor):
                plan.params[hf_name] = weight
            else:
                plan.linears[module_path] = weight
            plan.report[module_path] = note + (" (rows reordered)" if order is not None else "")
        else:
            plan.params[hf_name] = _dense(header, info, processor)
            check_finite(header.path, info.name, plan.params[hf_name])
            plan.report.setdefault(module_path, f"{info.kind} -> fp32")
    head = model.get_output_embeddings()
    if config.tie_word_embeddings and head is not None:
        head_path = next(name for name, module in model.named_modules() if module is head)
        embed_path = next(name for name, module in model.named_modules() if module is embedding)
        if embed_path in plan.linears and head_path not in plan.linears:
            plan.tied[head_path] = embed_path
            plan.report[head_path] = f"tied: shares {embed_path}'s quantized storage"
    _colocate_siblings(plan)
    return plan


def _install(model: nn.Module, plan: _Plan) -> nn.Module:
    tables: dict[str, QuantizedLinear] = {}
    for path, weight in plan.linears.items():
        module = model.get_submodule(path)
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        layer = QuantizedLinear(weight)
        if isinstance(module, nn.Embedding):
            tables[path] = layer
            layer = QuantizedEmbedding(layer, module.padding_idx, getattr(module, "embed_scale", None))
        setattr(parent, name, layer)
    for head_path, embed_path in plan.tied.items():
        parent_path, _, name = head_path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, name, QuantizedLinear(tables[embed_path].weight_data))
    for full_name, tensor in plan.params.items():
        module_path, _, attr = full_name.rpartition(".")
        module = model.get_submodule(module_path)
        if isinstance(module, QuantizedLinear):
            setattr(module, attr, tensor.float())
        else:
            setattr(module, attr, nn.Parameter(tensor.float(), requires_grad=False))
    if getattr(model.config, "tie_word_embeddings", False):
        head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
        if isinstance(head, nn.Linear) and isinstance(embedding, nn.Embedding) and head.weight.is_meta:
            head.weight = embedding.weight
    left = [name for name, tensor in list(model.named_parameters()) + list(model.named_buffers()) if tensor.is_meta]
    if left:
        raise ValueError(f"the GGUF file has no values for {left[:5]}{' ...' if len(left) > 5 else ''}")
    model.quantization_report = plan.report  # as `quantize_model` marks its models (the CPU backend reads it)
    return model


def _weights_file(directory: Path, scheme: str, group_size: int, dtype: torch.dtype, compact: tuple[str, ...]) -> Path:
    tag = scheme + (f"-g{group_size}" if scheme == "int4" else "") + f"-{str(dtype).removeprefix('torch.')}"
    tag += "".join(f"-{kind.lower()}int8" for kind in sorted(compact)) if scheme == "file" else ""
    kernel = f"blocks{blocks.LAYOUT_VERSION}" if scheme == "file" and _uses_blocks(dtype) else signature()
    return directory / f"weights-v{_FORMAT_VERSION}-{tag}-{kernel}.safetensors"


def is_cached(path: str | Path, scheme: str = "file", group_size: int = 32, dtype: torch.dtype = kernels.FAST_DTYPE,
              compact: tuple[str, ...] = ()) -> bool:  # fmt: skip
    """Whether `load_gguf_quantized(path, ...)` with these settings would read its repacked weights from the cache."""
    directory = cache.entry_dir(Path(path).expanduser().resolve())
    weights = _weights_file(directory, scheme, group_size, dtype, tuple(sorted(compact)))
    return (directory / "config.json").is_file() and weights.is_file()


def _save_plan(path: Path, plan: _Plan) -> None:
    tensors, linears = {}, {}
    for module_path, weight in plan.linears.items():  # "<module>.<buffer>", as the layer's state_dict names them
        for name, tensor in weight.buffers().items():
            tensors[f"{module_path}.{name}"] = tensor
        linears[module_path] = {"scheme": weight.format, **weight.meta()}
    for name, tensor in plan.params.items():
        tensors[f"param:{name}"] = tensor
    manifest = {"version": _FORMAT_VERSION, "linears": linears, "tied": plan.tied, "report": plan.report}
    cache.write_atomically(path, lambda tmp: _write_tensors(tmp, tensors, {"manifest": json.dumps(manifest)}))


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A safetensors file of `tensors`, each written from its own memory (safetensors' `save_file` first copies every
    tensor into a bytes object: the whole model twice in memory while it writes; and it refuses tensors that share a
    buffer, as the sibling projections placed together do)."""
    names = {dtype: name for name, dtype in _STORED_DTYPES.items()}
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + tensor.nbytes]}  # fmt: skip
        offset += tensor.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as handle:
        handle.write(len(encoded).to_bytes(8, "little"))
        handle.write(encoded)
        for name in sorted(tensors):
            tensor = tensors[name].contiguous()
            if tensor.nbytes:
                handle.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))


_STORED_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
                  "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
                  "BOOL": torch.bool}  # fmt: skip


def _read_tensors(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """A safetensors file's metadata and tensors, each read straight into memory of its own. Not a mapping of the
    file: tensors viewing one would keep the whole mapping resident, and the projections that `fuse_projections`
    replaces by fused copies would stay in memory beside them (measured on SmolLM2-135M: 42 MiB of 92)."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
        metadata = header.pop("__metadata__", None) or {}
        tensors = _sibling_views(header)
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            begin, end = entry["data_offsets"]
            tensor = tensors.get(name)
            if tensor is None:
                tensor = torch.empty(entry["shape"], dtype=_STORED_DTYPES[entry["dtype"]])
            if end > begin:
                handle.seek(8 + size + begin)
                if handle.readinto(memoryview(tensor.reshape(-1).view(torch.uint8).numpy())) != end - begin:
                    raise ValueError(f"{path}: {name} is cut short (a damaged cache entry: delete the file)")
            tensors[name] = tensor
    return metadata, tensors


def _sibling_views(header: dict[str, dict]) -> dict[str, torch.Tensor]:
    """For a cache file's tensor table: the buffers of sibling projections (q/k/v, gate/up: `fusion.SIBLINGS`) as
    views of one allocation per group and buffer name, one after the other (`_colocate_siblings` without a copy)."""
    views: dict[str, torch.Tensor] = {}
    for key in header:
        path, _, buffer = key.rpartition(".")
        parent, _, name = path.rpartition(".")
        names = next((group for group in SIBLINGS if group[0] == name), None)
        if names is None or key.startswith("param:"):
            continue
        entries = [header.get(f"{parent}.{sibling}.{buffer}") for sibling in names]
        if any(entry is None or entry["dtype"] != entries[0]["dtype"] or len(entry["shape"]) == 0
               or entry["shape"][1:] != entries[0]["shape"][1:] for entry in entries):  # fmt: skip
            continue
        rows = [entry["shape"][0] for entry in entries]
        buffer_tensor = torch.empty([sum(rows), *entries[0]["shape"][1:]], dtype=_STORED_DTYPES[entries[0]["dtype"]])
        start = 0
        for sibling, count in zip(names, rows):
            views[f"{parent}.{sibling}.{buffer}"] = buffer_tensor[start : start + count]
            start += count
    return views


def _release_load_copies(plan: _Plan) -> None:
    """Drop the plan's tensors (the model holds those it uses; the projections `fuse_projections` replaced by fused
    copies go with them) and hand the heap pages freed so back to the system (`native.heap.trim_heap`)."""
    plan.linears.clear()
    plan.params.clear()
    trim_heap()


def _colocate_siblings(plan: _Plan) -> None:
    """Put the block tensors of each group of projections `fuse_projections` will join (q/k/v, gate/up) one after the
    other in one buffer, each sibling's field a view of it, so that the fused layer is a view of that buffer and not
    a second copy beside the plan's (the same bytes: nothing changes in the numbers). One group is copied at a time:
    the load holds at most one group twice."""
    for module_path in list(plan.linears):
        parent, _, name = module_path.rpartition(".")
        names = next((group for group in SIBLINGS if group[0] == name), None)
        if names is None:
            continue
        weights = [plan.linears.get(f"{parent}.{sibling}") for sibling in names]
        if not all(isinstance(weight, BlockWeight) for weight in weights):
            continue
        fields = [weight.tensors() for weight in weights]
        if any(set(named) != set(fields[0]) for named in fields):
            continue
        for field_name in fields[0]:
            parts = [named[field_name] for named in fields]
            if adjacent(parts) or any(part.dtype != parts[0].dtype or part.shape[1:] != parts[0].shape[1:]
                                      for part in parts):  # fmt: skip
                continue
            buffer, start = torch.cat(parts), 0
            for weight, part in zip(weights, parts):
                setattr(weight, field_name, buffer[start : start + part.shape[0]])
                start += part.shape[0]
        del fields
    trim_heap()  # the replaced copies' pages (glibc keeps small blocks resident otherwise)


def _load_plan(path: Path) -> _Plan | None:
    metadata, tensors = _read_tensors(path)
    manifest = json.loads(metadata["manifest"])
    if manifest.get("version") != _FORMAT_VERSION:
        return None
    plan = _Plan(tied=manifest["tied"], report=manifest["report"])
    stored: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if not key.startswith("param:"):
            module_path, _, name = key.rpartition(".")
            stored.setdefault(module_path, {})[name] = tensor
    for module_path, entry in manifest["linears"].items():
        meta = {key: value for key, value in entry.items() if key != "scheme"}
        plan.linears[module_path] = format_class(entry["scheme"]).from_buffers(stored[module_path], meta)
    plan.params = {key.removeprefix("param:"): value for key, value in tensors.items() if key.startswith("param:")}
    del tensors, stored  # the plan holds them now: a sibling's copy replaced next is freed at once
    _colocate_siblings(plan)
    return plan


class _Background:
    """Run a callable in a thread; `result()` waits and re-raises its exception."""

    def __init__(self, work, started_at: float) -> None:
        self._value, self._error = None, None
        self.started_at, self.finished = started_at, None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work) -> None:
        try:
            self._value = work()
        except BaseException as error:  # re-raised in result()
            self._error = error
        self.finished = time.perf_counter()

    def wait(self) -> None:
        """Until the work is done (its exception, if any, is raised by `result()`)."""
        self._thread.join()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def load_gguf_tokenizer(path: str | Path, use_cache: bool = True):
    """The tokenizer of a GGUF file: from the cache once built (transformers' GGUF tokenizer path parses the whole
    file, many seconds for a large vocabulary), else built from the file and cached."""
    from transformers import PreTrainedTokenizerFast

    path = Path(path).expanduser().resolve()
    directory = cache.entry_dir(path) if use_cache else None
    if directory is not None and (directory / "tokenizer" / "tokenizer.json").is_file():
        loaded = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer" / "tokenizer.json"),
                                         **_saved_settings(directory / "tokenizer"))  # fmt: skip
        trim_heap()  # parsing tokenizer.json leaves freed pages resident (Gemma 3's 262k vocabulary: ~190 MB)
        return loaded
    return _tokenizer_from_file(path, directory)


def _saved_settings(folder: Path) -> dict:
    """The special tokens, chat template and flags `save_pretrained` wrote next to tokenizer.json."""
    config = folder / "tokenizer_config.json"
    settings = json.loads(config.read_text()) if config.is_file() else {}
    template = folder / "chat_template.jinja"
    if template.is_file():
        settings["chat_template"] = template.read_text()
    keep = ("bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token", "add_eos_token", "chat_template",
            "model_max_length", "clean_up_tokenization_spaces")  # fmt: skip
    return {key: value for key, value in settings.items() if key in keep}


def _tokenizer_from_file(path: Path, directory: Path | None):
    """The file's tokenizer, built from its metadata with transformers' own GGUF converter (a fraction of what
    AutoTokenizer's GGUF path takes, which parses the whole file; the same ids, specials and template), cached
    under `directory`."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        try:
            from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

            architecture, description, settings = get_gguf_tokenizer(str(path))
            backend, extra = convert_gguf_tokenizer(architecture, description)
            loaded = PreTrainedTokenizerFast(tokenizer_object=backend, **settings, **extra)
        except (ImportError, KeyError, ValueError):  # an older transformers: its AutoTokenizer path
            loaded = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as error:  # noqa: BLE001 - a damaged vocabulary fails anywhere inside transformers / tokenizers
        reason = (str(error).strip().splitlines() or [""])[0][:160]
        raise GGUFModelError(path, "tokenizer.ggml.*", f"no tokenizer can be built from the file's vocabulary "
                                                       f"({type(error).__name__}: {reason})") from None  # fmt: skip
    if directory is not None:
        target = directory / "tokenizer"
        if not target.is_dir():
            cache.write_dir_atomically(target, lambda tmp: loaded.save_pretrained(str(tmp)))
    trim_heap()  # the converter's temporaries (the vocabulary read from the file, a copy of the backend, the JSON)
    return loaded


def load_gguf_quantized(
    path: str | Path,
    scheme: str = "file",
    group_size: int = 32,
    dtype: torch.dtype = kernels.FAST_DTYPE,
    tokenizer: bool = True,
    use_cache: bool = True,
    cache_root: Path | None = None,
    compact: tuple[str, ...] = (),
    native: bool = True,
    kv_cache_dtype: str = "fp32",
) -> LoadedGGUF:
    """A transformers causal LM for the GGUF file `path` with quantized weights (see the module docstring).

    scheme: "file" (each tensor in the kernel layout nearest its own format), "int8", "int4"
    (requantized, groups of `group_size`) or "dense" (fp32). dtype: the kernels' compute dtype
    (bf16: fast; fp32: the exact reference, slow). compact: GGUF formats to store as int8 per row
    rather than exactly ("Q6_K": 1 byte a weight instead of 2; see `gguf.kernel_layout`). native: the model stepped
    by the native decoder where it covers it (the default; `LoadedGGUF.step` says which path runs and why); False
    keeps transformers' modeling (hooks on its layers run, as `train-draft` needs). kv_cache_dtype: the native
    step's key/value cache, "fp32" (the default: attention as the fp32 reference computes it), "fp16" or "bf16"
    (half the bytes a step reads at long contexts; assisted decoding still equals plain decoding in that mode, and
    differs from the fp32 reference by the cache's rounding: docs/native.md).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not one of {SCHEMES}")
    if scheme in ("int8", "int4", "file"):
        missing = kernels.available().missing("int8") or (
            kernels.available().missing("int4") if scheme != "int8" else ""
        )
        if missing:
            raise NotImplementedError(missing)
    gguf.require_gguf()
    started = time.perf_counter()
    path = Path(path).expanduser().resolve()
    caching = use_cache and scheme != "dense"
    directory = cache.entry_dir(path, cache_root) if caching else None
    compact = tuple(sorted(compact))
    weights = _weights_file(directory, scheme, group_size, dtype, compact) if caching else None

    if caching and (directory / "config.json").is_file() and weights.is_file():
        from transformers import AutoConfig

        plan = _load_plan(weights)
        if plan is not None:
            config = AutoConfig.from_pretrained(str(directory))
            check_file(read_header(path), config)  # milliseconds; an entry cached by an older package was not checked
            model = _install(_skeleton(config), plan)
            fuse_projections(model)
            _release_load_copies(plan)
            stepped = LoadedGGUF.stepped(model, native, kv_cache_dtype)
            ready = time.perf_counter() - started
            # After the model: a tokenizer thread started earlier would slow the model's build (GIL).
            pending = None
            if tokenizer and (directory / "tokenizer").is_dir():
                pending = _Background(lambda: load_gguf_tokenizer(path), started)
            elif tokenizer:
                pending = _Background(lambda: _tokenizer_from_file(path, directory), started)
            return LoadedGGUF(stepped, pending, directory, True, ready, plan.report, model)

    header = read_header(path)
    config = load_config(header)
    pending = _Background(lambda: _tokenizer_from_file(path, directory), started) if tokenizer else None
    if pending is not None:  # built before the weights: its peak (a 262k vocabulary: +350 MiB) is then not on theirs
        pending.wait()
    model = _skeleton(config)
    plan = _plan_from_file(model, header, config, scheme, group_size, dtype, compact)
    model = _install(model, plan)
    fuse_projections(model)
    if caching:
        if not (directory / "config.json").is_file():
            cache.write_atomically(directory / "config.json", lambda tmp: tmp.write_text(config.to_json_string()))
        _save_plan(weights, plan)
    _release_load_copies(plan)
    stepped = LoadedGGUF.stepped(model, native, kv_cache_dtype)
    return LoadedGGUF(stepped, pending, directory, False, time.perf_counter() - started, plan.report, model)

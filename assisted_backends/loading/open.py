"""The loading room: a model argument (a saved directory, a `.gguf` file or a directory holding one, a Hub id) ->
its model, tokenizer, generation settings and chat template. The command line and the server (through
`startup.pair`) and the API (`open_arguments`) open models here.

Below it, each a floor lower: `loading.models` (one loader per kind of argument), `loading.files` (which file a
name names, its dequantized conversion), `quantized` (a `.gguf`'s header and weights). Order of work for a name:
the tokenizer first (building one from a `.gguf` with a 262k vocabulary peaks at +350 MiB: before the weights are
resident, not on top of them; benchmarks/RESULTS.md, opening a .gguf), then the weights, with one line before and
one after a `.gguf`'s first repacking or conversion (it can take a minute); the generation settings are read from
the files when first asked for (a `.gguf`'s from its metadata, milliseconds).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assisted_backends.drafters.eagle.build import is_eagle_head
from assisted_backends.loading import files, models

Report = Callable[[str], None]  # where the conversion lines go (the command lines: stderr)


@dataclass(frozen=True)
class LoadedModel:
    """One opened model argument: `name` as given, `what` it is called in errors (`-m/--model`, `assistant_model`),
    the model in eval mode and its tokenizer (None: an EAGLE-3 head, which drafts in its target's, or not asked for)."""

    name: str
    what: str
    model: Any
    tokenizer: Any = None

    @functools.cached_property
    def generation_settings(self) -> dict:
        """The fields of the files' `generation_config.json` ({} for a Hub id or a model without one; a `.gguf`'s as
        transformers' conversion writes them, from its metadata)."""
        return models.saved_generation_config(self.name, self.what)

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template (a `.gguf`'s from its `tokenizer.chat_template` metadata), or None."""
        return getattr(self.tokenizer, "chat_template", None)

    @property
    def model_type(self) -> str | None:
        """The config's `model_type` (`llama`, `gemma3_text`, ...), or None."""
        return getattr(getattr(self.model, "config", None), "model_type", None)


def is_gguf(name: str | os.PathLike, what: str = "model") -> bool:
    """Whether `name` is a `.gguf` file or a directory holding one (a one-line error for a path that names nothing)."""
    return files.find_gguf(name, what) is not None


def open_model(
    name: str | os.PathLike,
    what: str = "model",
    precision: str | None = None,
    *,
    tokenizer: bool = True,
    report: Report | None = None,
) -> LoadedModel:
    """The model `name` stands for in `precision` (`loading.models.load_model`'s names), its tokenizer first when
    asked for; `report` gets one line before and one after a `.gguf`'s first repacking or conversion."""
    loaded_tokenizer = models.load_tokenizer(name, what) if tokenizer else None
    return LoadedModel(str(name), what, _weights(name, what, precision, report), loaded_tokenizer)


def _weights(name: str | os.PathLike, what: str, precision: str | None, report: Report | None):
    gguf = files.find_gguf(name, what)
    quantized = precision in (None, "int8", "int4")
    if report is None or gguf is None or _converted(gguf, precision, quantized):
        return models.load_model(name, what, precision)
    kind = f"{precision or 'its own'} quantization, repacked for the CPU kernels" if quantized else "a model directory"
    report(f"converting {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) to {kind}, once (cached by content; "
           "load times: docs/quantized.md)...")  # fmt: skip
    began = time.perf_counter()
    model = models.load_model(name, what, precision)
    report(f"converted {gguf.name} in {time.perf_counter() - began:.1f} s")
    return model


def _converted(gguf: Path, precision: str | None, quantized: bool) -> bool:
    """Whether `gguf` was repacked (kept quantized) or converted (dequantized) before: its cache entry is there."""
    from assisted_backends.quantized.model import is_cached

    if quantized:
        files.share_quantized_entry(gguf)  # a renamed copy of a repacked file finds its entry
        return is_cached(gguf, scheme=precision or "file")
    return (files.converted_dir(gguf) / "config.json").is_file()


def open_arguments(
    model, assistant_model, tokenizer, assistant_tokenizer, dtype: str | None = None, draft_precision: str | None = None
) -> tuple:
    """`generate`'s model arguments with every `str`/`Path` opened (in `dtype` / `draft_precision`). When the two
    opened models have different vocabularies and no tokenizers were given, both names' tokenizers are loaded too,
    so cross-tokenizer drafting works."""
    model_name = model if isinstance(model, (str, os.PathLike)) else None
    draft_name = assistant_model if isinstance(assistant_model, (str, os.PathLike)) else None
    if model_name is not None:
        model = opened_model(model_name, "model", dtype)
    if draft_name is not None:
        assistant_model = opened_model(draft_name, "assistant_model", draft_precision or dtype)
    named = model_name is not None and draft_name is not None and tokenizer is None and assistant_tokenizer is None
    if named and not is_eagle_head(assistant_model):  # an EAGLE-3 head drafts in the target's vocabulary
        if model.get_input_embeddings().num_embeddings != assistant_model.get_input_embeddings().num_embeddings:
            tokenizer = models.load_tokenizer(model_name, "model")
            assistant_tokenizer = models.load_tokenizer(draft_name, "assistant_model")
    return model, assistant_model, tokenizer, assistant_tokenizer


OPENED_LIMIT = 4  # models kept by `opened_model`: a target and its draft, twice over


@dataclass(frozen=True)
class _Key:
    """What makes an opened name reusable: the path (resolved) or Hub id, the file's size and change time (a file
    written again is opened again), and the precision asked for."""

    name: str
    stamp: tuple[int, int] | None
    precision: str | None


_opened: dict[_Key, Any] = {}  # least recently used first


def opened_model(name: str | os.PathLike, what: str, precision: str | None) -> Any:
    """The model `name` names, opened once per process and reused by every later call naming the same file (or Hub
    id) in the same precision, so that what is kept per model (the suffix index, the prefix cache) learns across
    `generate(path, ...)` calls as it does through one `AssistedGenerator`. The last `OPENED_LIMIT` are kept;
    `forget_opened_models()` lets them go."""
    key = _key(name, precision)
    model = _opened.pop(key, None)
    if model is None:
        model = open_model(name, what, precision, tokenizer=False).model
    _opened[key] = model  # the most recently used last
    while len(_opened) > OPENED_LIMIT:
        _opened.pop(next(iter(_opened)))
    return model


def forget_opened_models() -> None:
    """Drop every model `opened_model` keeps (their memory returns once no caller holds them)."""
    _opened.clear()


def _key(name: str | os.PathLike, precision: str | None) -> _Key:
    path = Path(name).expanduser()
    if not path.exists():
        return _Key(str(name), None, precision)  # a Hub id: its snapshot is the hub cache's to keep fresh
    gguf = files.find_gguf(path, "model")
    target = (gguf or path).resolve()
    entries = [target] if target.is_file() else [entry for entry in target.iterdir() if entry.is_file()]
    stats = [entry.stat() for entry in entries]
    stamp = (sum(stat.st_size for stat in stats), max((stat.st_mtime_ns for stat in stats), default=0))
    return _Key(str(target), stamp, precision)

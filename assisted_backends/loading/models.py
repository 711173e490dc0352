"""One loader per kind of model argument: a saved model directory, a `.gguf` file (or a directory holding one), a
Hub id (`loading.open` opens a name through these).

A directory holding an EAGLE-3 head (`drafters.eagle.checkpoint`: `fc.weight` and `midlayer.*` tensors, in
either published layout) loads as an `Eagle3Head`; it has no tokenizer of its own (it drafts in its target's).

Local files first: a Hub id is looked up in the local cache, and downloaded only when it is not there and
the Hub is reachable (never when `HF_HUB_OFFLINE=1`). Every failure is one line naming the argument
(`ModelFileError`), never a traceback from inside transformers.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from assisted_backends import hf_compat
from assisted_backends.backends.base import DTYPES
from assisted_backends.drafters.eagle.checkpoint import is_eagle_checkpoint, load_head
from assisted_backends.loading import files
from assisted_backends.loading.files import ModelFileError


@functools.lru_cache(maxsize=8)
def resolve(name: str, what: str) -> str:
    """What `from_pretrained` should read for `name`: a saved directory as is, a `.gguf` file (or a directory
    holding one) as its cached converted fp32 directory (only `load_model` in a dequantized precision asks for that:
    everything else reads a `.gguf` itself), a Hub id unchanged."""
    return files.model_dir(name, what)


def gguf_config(gguf: Path, what: str = "model") -> dict:
    """The config transformers builds for a `.gguf` file, from its header's metadata alone (`quantized.hf_config`;
    milliseconds, no weight read, nothing written); a file cut short is refused in one line."""
    from assisted_backends.quantized.hf_config import config_dict

    return config_dict(files.check_complete(gguf, what))


def _offline(name: str, what: str) -> ModelFileError:
    return ModelFileError(
        f"{what} {name!r} is not on disk and could not be downloaded (this machine may be offline): download it "
        f"where the Hub is reachable (`hf download {name}`) and pass its directory to {what}"
    )


def eagle_directory(resolved: str) -> str | None:
    """The local directory of the EAGLE-3 head `resolved` names (a directory, or a Hub id whose snapshot is in the
    local cache or, when the Hub is reachable and its config.json describes a one-layer head, downloaded), or None
    when it names something else."""
    if Path(resolved).is_dir() or Path(resolved).expanduser().exists():
        return resolved if is_eagle_checkpoint(resolved) else None
    if resolved.count("/") != 1:
        return None
    from huggingface_hub import hf_hub_download, snapshot_download

    patterns = ["*.json", "*.safetensors", "pytorch_model.bin"]
    try:
        folder = snapshot_download(resolved, local_files_only=True, allow_patterns=patterns)
    except Exception:  # noqa: BLE001 - not in the local cache (or not a repository): ask the Hub, if allowed
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            return None
        try:
            config = json.loads(Path(hf_hub_download(resolved, "config.json")).read_text())
            if config.get("num_hidden_layers") != 1 and "draft_vocab_size" not in config:
                return None
            folder = snapshot_download(resolved, allow_patterns=patterns)
        except Exception:  # noqa: BLE001 - unreachable or unknown: the ordinary loader reports it
            return None
    return folder if is_eagle_checkpoint(folder) else None


def load_model(name: str | os.PathLike, what: str = "model", precision: str | None = None, native: bool = True):
    """The model `name` stands for, in eval mode, local files first.

    `precision` (the backend's `dtype` / `draft_precision` names): a `.gguf` file keeps its own quantization
    by default (None), or is requantized ("int8", "int4") straight from its blocks (`quantized.model`);
    any other precision loads the dequantized fp32 conversion (`loading.files`), cast to "fp32" / "bf16" /
    "fp16" when named. A checkpoint is loaded in the dtype named ("fp32" / "bf16" / "fp16"), else its own.
    `native=False` keeps a kept-quantized `.gguf` on transformers' modeling (what reads its layers and tables, as
    `train-draft` does) instead of the native decoder step."""
    from transformers import AutoModelForCausalLM

    gguf = files.find_gguf(name, what)
    if gguf is not None and precision in (None, "int8", "int4"):
        files.require_gguf(gguf, what)
        files.check_complete(gguf, what)
        files.share_quantized_entry(gguf)
        from assisted_backends.quantized.model import load_gguf_quantized

        # one native call a forward where the decoder covers the model (the report's step line says which ran)
        return load_gguf_quantized(gguf, scheme=precision or "file", tokenizer=False, native=native).model.eval()
    resolved = resolve(str(name), what)
    head_dir = eagle_directory(resolved)
    if head_dir is not None:
        return load_head(head_dir, DTYPES.get(precision))
    kwargs = hf_compat.dtype_kwargs(DTYPES.get(precision))  # `dtype=` or, before transformers 4.56, `torch_dtype=`
    try:
        return AutoModelForCausalLM.from_pretrained(resolved, local_files_only=True, **kwargs).eval()
    except (OSError, ValueError) as local_error:
        if Path(resolved).is_dir():
            raise ModelFileError(f"cannot load {what} from {resolved}: {local_error}") from None
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise _offline(str(name), what)
    try:
        return AutoModelForCausalLM.from_pretrained(resolved, **kwargs).eval()
    except OSError:
        raise _offline(str(name), what) from None


def load_tokenizer(name: str | os.PathLike, what: str = "model"):
    """`AutoTokenizer.from_pretrained`, local files first; a `.gguf` file's from its own cache entry; None for an
    EAGLE-3 head (it uses its target's)."""
    from transformers import AutoTokenizer

    gguf = files.find_gguf(name, what)
    if gguf is not None:
        files.require_gguf(gguf, what)
        files.check_complete(gguf, what)
        files.share_quantized_entry(gguf)  # a renamed copy finds its entry before the tokenizer is cached there
        from assisted_backends.quantized.model import load_gguf_tokenizer

        return load_gguf_tokenizer(gguf)
    resolved = resolve(str(name), what)
    if eagle_directory(resolved) is not None:
        return None
    try:
        return AutoTokenizer.from_pretrained(resolved, local_files_only=True)
    except (OSError, ValueError):
        if Path(resolved).is_dir() or os.environ.get("HF_HUB_OFFLINE") == "1":
            raise ModelFileError(
                f"no tokenizer found for {what} {name!r}; save the tokenizer next to the model"
            ) from None
    try:
        return AutoTokenizer.from_pretrained(resolved)
    except OSError:
        raise _offline(str(name), what) from None


def saved_generation_config(name: str | os.PathLike, what: str = "model") -> dict:
    """The fields of a local model's `generation_config.json` ({} for a Hub id or a model without one); for a `.gguf`
    file, what transformers writes there for it (its config's generation fields: the `tokenizer.ggml.*` BOS, EOS and
    padding ids), read from the metadata."""
    gguf = files.find_gguf(name, what)
    if gguf is not None:
        from transformers import AutoConfig, GenerationConfig, PretrainedConfig

        config = gguf_config(gguf, what)
        try:
            source = AutoConfig.for_model(**config)  # the config class transformers' conversion builds, its defaults
        except Exception:  # noqa: BLE001 - values the class refuses are the loader's checks' to name; the ids stand
            source = PretrainedConfig(**config)
        return json.loads(GenerationConfig.from_model_config(source).to_json_string())
    path = Path(resolve(str(name), what)) / "generation_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}

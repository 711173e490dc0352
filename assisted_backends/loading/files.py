"""Model arguments that name files: a saved model directory, a `.gguf` file, or a directory holding one.

(`loading.models` loads what these name; this module finds and converts the files.)

A `.gguf` file is read where it lies: its type, config and generation settings from its header's metadata
(`quantized.gguf_header`, milliseconds), its weights repacked for the CPU kernels (`quantized.model`). Only a
dequantized precision (`--dtype fp32` / `bf16` / `fp16`, `load_model(precision=...)`) converts it: once, with
transformers' GGUF support (`from_pretrained(dir, gguf_file=...)`, which needs the `gguf` and `accelerate` packages
and dequantizes every weight to fp32), saved as an ordinary model directory under the user's cache, keyed by the
file's sha256 alone (a renamed file is not converted again): `$ASSISTED_BACKENDS_CACHE/gguf/<sha16>/` (default
`~/.cache/assisted_backends`; sha16: the first 16 hex digits). Later dequantized loads read that directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from assisted_backends.cache_dir import cache_root

if TYPE_CHECKING:
    from assisted_backends.quantized.gguf_header import GGUFHeader

GGUF_INSTALL = "pip install gguf accelerate"  # or the package's extra: pip install "assisted_backends[gguf]"
GGUF_SUFFIX = ".gguf"


class ModelFileError(ValueError):
    """A model argument that names no loadable model; the message is one line saying what to pass."""


class MissingGGUFError(ImportError):
    """A `.gguf` model argument on an installation without the `gguf` (or `accelerate`) package."""


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or name.lower().endswith(GGUF_SUFFIX)


def find_gguf(name: str | os.PathLike, what: str = "model") -> Path | None:
    """The GGUF file `name` stands for: the file itself, or the only `.gguf` in a directory without
    `config.json`. None for a saved model directory or a Hub id; a one-line error for anything else."""
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix.lower() != GGUF_SUFFIX:
            raise ModelFileError(f"{what} {path} is not a .gguf file; pass a saved model directory or a .gguf file")
        return path
    if not path.is_dir():
        if path.exists() or _looks_like_path(str(name)):
            kind = "file" if path.suffix.lower() == GGUF_SUFFIX else "directory"
            raise ModelFileError(f"{what} {kind} {path} does not exist; pass a saved model directory or a .gguf file")
        return None
    if (path / "config.json").is_file():
        return None
    found = sorted(path.glob(f"*{GGUF_SUFFIX}"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise ModelFileError(
            f"{what} directory {path} has no config.json or .gguf file; pass a saved model directory or a .gguf file"
        )
    names = ", ".join(p.name for p in found)
    raise ModelFileError(f"{what} directory {path} holds several .gguf files ({names}); pass the one file to load")


def require_gguf(path: Path, what: str = "model") -> None:
    """A one-line error naming the install command when transformers' GGUF loading cannot run here."""
    missing = [module for module in ("gguf", "accelerate") if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingGGUFError(
            f"{what} {path} is a GGUF file, and loading it needs the {' and '.join(missing)} "
            f"package{'s' if len(missing) > 1 else ''}: {GGUF_INSTALL}"
        )


def incomplete(path: Path, what: str, error: Exception | None = None, end: int | None = None) -> ModelFileError:
    """The one-line error for a GGUF file cut short: its header unreadable (`error`, a
    `quantized.gguf_header.GGUFFormatError`: its reason) or its tensors ending past the file (`end`)."""
    size = path.stat().st_size
    if error is not None:
        reason = getattr(error, "reason", error)
        return ModelFileError(f"{what} {path}: not a complete GGUF file ({size} bytes; its header cannot be read: "
                              f"{reason}); download or copy it again")  # fmt: skip
    return ModelFileError(f"{what} {path}: the GGUF file is truncated ({size} bytes; its tensors end at byte {end}); "
                          "download or copy it again")  # fmt: skip


def check_complete(path: Path, what: str = "model") -> GGUFHeader:
    """The file's header; a GGUF file whose header cannot be read, or whose tensor data runs past its end (a download
    or copy cut short), is refused in one line before any loader meets it (`quantized.gguf_header`, the one header
    reader)."""
    from assisted_backends.quantized.gguf_header import GGUFFormatError, read_header

    try:
        header = read_header(path)
    except GGUFFormatError as error:
        raise incomplete(path, what, error) from None
    end = header.data_end()
    if end > header.size:
        raise incomplete(path, what, end=end)
    return header


def share_quantized_entry(gguf: Path) -> Path:
    """The repacked-weights cache entry of `gguf` (`quantized.cache`, named `<stem>-<sha16>`): when a file with
    the same content was repacked under another name, the entry for this name becomes a link to that one, so a
    renamed or copied file is not repacked again. Returns the entry (it may not exist yet)."""
    from assisted_backends.quantized.cache import cache_root as quantized_root
    from assisted_backends.quantized.cache import entry_dir

    entry = entry_dir(gguf)
    if entry.exists():
        return entry
    sha16 = entry.name.rsplit("-", 1)[-1]
    for other in sorted(quantized_root().glob(f"*-{sha16}")):
        if other.is_dir() and (other / "config.json").is_file():
            try:
                entry.symlink_to(other.name, target_is_directory=True)
            except FileExistsError:  # another process linked it first
                pass
            break
    return entry


def converted_dir(gguf: Path) -> Path:
    """Where the converted model directory of `gguf` lives in the cache (it may not exist yet): named by the
    file's sha256 alone, so a renamed or copied file finds its conversion (the digest is remembered by path,
    size and mtime, so a file is hashed once)."""
    from assisted_backends.quantized.cache import remembered_sha256

    root = cache_root() / "gguf"
    return root / remembered_sha256(gguf, root)[:16]


def convert_gguf(gguf: Path, output: Path, what: str = "model") -> Path:
    """Load `gguf` (model and tokenizer) with transformers and save both as a plain model directory.

    transformers refuses to save a GGUF-loaded model ("not serializable"), but the loaded tensors are
    already dequantized, so dropping the quantizer and its config first saves an ordinary checkpoint.
    The directory is written under a temporary name and renamed, so a crash never leaves half of one.
    """
    require_gguf(gguf, what)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}-", dir=output.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        try:
            staging.rename(output)
        except OSError:  # another process finished the same conversion first
            if not (output / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def model_dir(name: str | os.PathLike, what: str = "model") -> str:
    """What `from_pretrained` should load for a model argument in a dequantized precision: a `.gguf` file (or a
    directory holding one) becomes its cached converted fp32 directory, converted on first use (the one place that
    converts: callers reach it only for `fp32` / `bf16` / `fp16`); a saved model directory or a Hub id comes back
    unchanged."""
    gguf = find_gguf(name, what)
    if gguf is None:
        return str(Path(name).expanduser()) if Path(name).expanduser().is_dir() else str(name)
    output = converted_dir(gguf)
    if not (output / "config.json").is_file():
        require_gguf(gguf, what)
        check_complete(gguf, what)
        convert_gguf(gguf, output, what)
    return str(output)

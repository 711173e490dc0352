"""Where repacked GGUF weights are cached, and how files get there atomically.

`<root>/quantized/<stem>-<sha16>/` with root `$ASSISTED_BACKENDS_CACHE`, else
`$XDG_CACHE_HOME/assisted_backends`, else `~/.cache/assisted_backends` (the package's usual root).
sha16: the first 16 hex digits of the file's sha256. Hashing a 250 MB file costs about a second and a
half here, so the digest is remembered in `<root>/quantized/sha256.json` by (path, size, mtime).
Every file is written under a temporary name in the same directory and renamed into place
(`os.replace`), so a reader sees a whole file or none; a directory likewise.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from assisted_backends.cache_dir import cache_root as package_cache
from assisted_backends.cache_dir import file_sha256

_INDEX = "sha256.json"


def cache_root() -> Path:
    """`<the package's cache>/quantized`."""
    return package_cache() / "quantized"


def remembered_sha256(path: Path, root: Path | None = None) -> str:
    """sha256 of `path`, from the index when its size and mtime are unchanged."""
    root = root or cache_root()
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    index_path = root / _INDEX
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if key in index:
        return index[key]
    digest = file_sha256(path)
    index[key] = digest
    root.mkdir(parents=True, exist_ok=True)
    write_atomically(index_path, lambda tmp: tmp.write_text(json.dumps(index, indent=0)))
    return digest


def entry_dir(path: Path, root: Path | None = None) -> Path:
    """`<root>/<stem>-<sha16>` for the GGUF file `path` (not created)."""
    root = root or cache_root()
    return root / f"{Path(path).stem}-{remembered_sha256(path, root)[:16]}"


def write_atomically(target: Path, write: Callable[[Path], object]) -> None:
    """Call write(tmp) on a temporary path next to `target`, then rename it to `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(handle)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_dir_atomically(target: Path, write: Callable[[Path], object]) -> None:
    """Call write(tmp_dir) on a fresh directory next to `target`, then rename it to `target`
    (a directory that appeared meanwhile wins: it was written the same way)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

"""The package's one cache directory, and the content hash that names what is cached in it (no heavy imports).

`$ASSISTED_BACKENDS_CACHE`, else `$XDG_CACHE_HOME/assisted_backends`, else `~/.cache/assisted_backends`:
converted and repacked GGUF models, the demo pair, PyPI wheels for the real-model lane, benchmark builds.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """`$ASSISTED_BACKENDS_CACHE`, else `$XDG_CACHE_HOME/assisted_backends`, else `~/.cache/assisted_backends`."""
    if os.environ.get("ASSISTED_BACKENDS_CACHE"):
        return Path(os.environ["ASSISTED_BACKENDS_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "assisted_backends"


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()

"""Training text every machine has: the Python standard library's own source files."""

from __future__ import annotations

import sysconfig
from pathlib import Path


def stdlib_files() -> list[Path]:
    """The top-level `.py` files of the running interpreter's standard library, sorted by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(path for path in root.glob("*.py") if path.is_file())
    if not files:
        raise RuntimeError(f"no Python source found under {root}; the demo pair trains on the standard library")
    return files


def read_corpus(max_bytes: int) -> tuple[str, str]:
    """(training text, held-out text): every 10th file is held out for prompts and evaluation."""
    train: list[str] = []
    held_out: list[str] = []
    size = 0
    for index, path in enumerate(stdlib_files()):
        text = path.read_text(encoding="utf-8", errors="replace")
        if index % 10 == 9:
            held_out.append(text)
            continue
        if size >= max_bytes:
            continue
        train.append(text[: max_bytes - size])
        size += len(train[-1])
    return "\n\n".join(train), "\n\n".join(held_out)

"""Checks that run before any model loads (and before torch is imported): outputs that cannot be
written, a `--plot` without matplotlib, prompt files that cannot be read, `-m` pointing at a file.

Each problem is one line naming the flag and the fix, so a long run never fails at its end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from assisted_backends.cli.errors import CLIError
from assisted_backends.extras import install_hint

INSTALL_PLOT = install_hint("plot")


def check_output(path: str, flag: str) -> None:
    """The file can be created or overwritten: its directory exists and is writable, it is not a directory."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise CLIError(f"{flag} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise CLIError(f"{flag} {path}: directory {parent} does not exist; create it or choose another path")
    if target.exists() and not os.access(target, os.W_OK):
        raise CLIError(f"{flag} {path}: the file is not writable; choose another path")
    if not target.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"{flag} {path}: directory {parent} is not writable; choose another path")


def read_prompt_file(path: str) -> str:
    """The file's text, or one line saying why it cannot be used as `--prompt-file`."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise CLIError(f"--prompt-file {path}: is a directory; give a text file") from None
    except OSError as error:
        raise CLIError(f"--prompt-file {path}: {error.strerror or error}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CLIError(
            f"--prompt-file {path}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
            "give a text file"
        ) from None


def check_model_path(name: str | None, flag: str) -> None:
    """An absolute or ./~ path must exist, and a plain file must be a .gguf (Hub ids are checked on loading)."""
    if name is None:
        return
    path = Path(name).expanduser()
    if (path.is_absolute() or name.startswith((".", "~"))) and not path.exists():  # a path, not a Hub id
        raise CLIError(f"{flag} directory {name} does not exist; give a model directory, a .gguf file or a Hub id")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise CLIError(f"{flag} {name}: is a file, not a model; give a model directory, a .gguf file or a Hub id")


def preflight(args: argparse.Namespace) -> None:
    """Everything that can be checked without loading a model; caches the prompt file's text on `args`."""
    for flag, path in (("--json", args.json), ("--csv", args.csv), ("--plot", args.plot)):
        if path is not None:
            check_output(path, flag)
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise CLIError(f"--plot needs matplotlib: {INSTALL_PLOT}; or drop --plot")
    args.prompt_text = read_prompt_file(args.prompt_file) if args.prompt_file is not None else None
    check_model_path(args.model, "-m/--model")
    check_model_path(args.assistant_model, "--assistant-model")

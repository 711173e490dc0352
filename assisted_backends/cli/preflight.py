"""Checks that run before any model loads (and before torch is imported): outputs that cannot be
written, a `--plot` without matplotlib, prompt files that cannot be read, an empty prompt; the model and device
flags' (`startup.checks`); `--chat` without a chat template, `--assistant-early-exit` past the last layer,
lengths past the positions in config.json.

Each problem is one line naming the flag and the fix, so a long run never fails at its end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from assisted_backends.cli.cases import benchmark_cases
from assisted_backends.extras import install_hint
from assisted_backends.options import ranges
from assisted_backends.startup.checks import check_drafting_files, read_models
from assisted_backends.startup.errors import CLIError
from assisted_backends.startup.model_files import ModelFiles

INSTALL_PLOT = install_hint("plot")


def check_output(path: str, flag: str) -> None:
    """The file can be created or overwritten, proved by writing: an existing file is opened for appending
    (nothing changes), else a probe file is created beside it and removed. /proc, /sys, read-only mounts and
    missing directories fail here, before any model loads."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise CLIError(f"{flag} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise CLIError(f"{flag} {path}: directory {parent} does not exist; create it or choose another path")
    try:
        if target.exists():
            with open(target, "a", encoding="utf-8"):
                pass
        else:
            probe = parent / f".{target.name}.{os.getpid()}.probe"
            with open(probe, "w", encoding="utf-8") as handle:
                handle.write("probe")
            probe.unlink()
    except OSError as error:
        raise CLIError(f"{flag} {path}: cannot be written ({error.strerror or error}); choose another path") from None


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


def check_prompt(args: argparse.Namespace) -> None:
    """A prompt given by --prompt or --prompt-file has some text."""
    text = args.prompt_text if args.prompt_text is not None else args.prompt
    if text is not None and not text.strip():
        source = "--prompt-file" if args.prompt_text is not None else "--prompt"
        raise CLIError(f"{source}: the prompt is empty; pass some text with --prompt or --prompt-file")


def check_target(args: argparse.Namespace, target: ModelFiles) -> None:
    """--chat against the chat template, --assistant-early-exit against the layers, lengths against the positions."""
    if (args.chat or args.system is not None) and target.chat_template is False:
        raise CLIError(
            "--chat/--system: this model's tokenizer has no chat template (not an instruct model); drop them"
        )
    ranges.check_early_exit(args.assistant_early_exit, target.layers)  # the API's own rule, on config.json's values
    check_length(args, target)


def _prompt_tokens(args: argparse.Namespace, target: ModelFiles) -> int | None:
    """The longest prompt's token count (one per line of --prompt-file with --batch-size > 1), or None."""
    text = args.prompt_text if args.prompt_text is not None else args.prompt
    if not text:
        return None
    per_line = args.prompt_text is not None and args.batch_size > 1
    prompts = [line for line in text.splitlines() if line.strip()] if per_line else [text]
    counts = [target.count_tokens(prompt) for prompt in prompts]
    return None if None in counts else max(counts)


def check_length(args: argparse.Namespace, target: ModelFiles) -> None:
    """Prompt + new tokens fit the target's positions (config.json; the prompt counted by tokenizer.json)."""
    limit = target.position_limit
    if limit is None:
        return
    if args.task == "benchmark":
        prompt, new = max(p for p, _ in benchmark_cases(args)), max(n for _, n in benchmark_cases(args))
    else:
        prompt, new = _prompt_tokens(args, target), args.max_new_tokens
        if prompt is None:  # the prompt is not known yet: at least the new tokens must fit
            if new >= limit:
                raise CLIError(f"--max-new-tokens {new} leaves no room for a prompt in the target's {limit} "
                               "positions (config.json); lower --max-new-tokens")  # fmt: skip
            return
    ranges.check_positions(prompt, new, limit, "new_tokens" if args.task == "benchmark" else "max_new_tokens")


def preflight(args: argparse.Namespace) -> None:
    """Everything that can be checked without loading a model; caches the prompt file's text on `args`."""
    for flag, path in (("--json", args.json), ("--csv", args.csv), ("--plot", args.plot)):
        if path is not None:
            check_output(path, flag)
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise CLIError(f"--plot needs matplotlib: {INSTALL_PLOT}; or drop --plot")
    args.prompt_text = read_prompt_file(args.prompt_file) if args.prompt_file is not None else None
    check_prompt(args)
    target = read_models(args)
    if target is not None:
        check_target(args, target)
    check_drafting_files(args, target)

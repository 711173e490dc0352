"""Checks that run before any model loads (and before torch is imported): outputs that cannot be
written, a `--plot` without matplotlib, prompt files that cannot be read, an empty prompt, `-m` pointing
at a file, a device this machine does not have, a dtype its CPU would emulate, a model directory without
weights or tokenizer, `--chat` without a chat template, `--assistant-early-exit` past the last layer,
lengths past the positions in config.json, a Hub id that is not cached on an offline machine.

Each problem is one line naming the flag and the fix, so a long run never fails at its end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from assisted_backends.cli import machine, model_files
from assisted_backends.cli.cases import benchmark_cases
from assisted_backends.cli.errors import CLIError
from assisted_backends.cli.loading import default_drafting
from assisted_backends.cli.model_files import ModelFiles
from assisted_backends.extras import install_hint
from assisted_backends.options import ranges
from assisted_backends.options.fields import DRAFTER_FIELDS

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


def check_model_path(name: str | None, flag: str) -> None:
    """An absolute or ./~ path must exist, and a plain file must be a .gguf (Hub ids are checked on loading)."""
    if name is None:
        return
    path = Path(name).expanduser()
    if (path.is_absolute() or name.startswith((".", "~"))) and not path.exists():  # a path, not a Hub id
        raise CLIError(f"{flag} directory {name} does not exist; give a model directory, a .gguf file or a Hub id")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise CLIError(f"{flag} {name}: is a file, not a model; give a model directory, a .gguf file or a Hub id")


def check_prompt(args: argparse.Namespace) -> None:
    """A prompt given by --prompt or --prompt-file has some text."""
    text = args.prompt_text if args.prompt_text is not None else args.prompt
    if text is not None and not text.strip():
        source = "--prompt-file" if args.prompt_text is not None else "--prompt"
        raise CLIError(f"{source}: the prompt is empty; pass some text with --prompt or --prompt-file")


def check_device(args: argparse.Namespace) -> None:
    """The device exists here (cheap probes), and on a CPU the dtypes asked for run natively."""
    problem = machine.device_problem(args.device)
    if problem is not None:
        raise CLIError(f"--device {args.device} is not available: {problem}; or use --device cpu")
    if machine.runs_on_cpu(args.device):
        for flag, dtype in (("--dtype", args.dtype), ("--draft-precision", args.draft_precision)):
            problem = machine.dtype_problem(dtype, flag)
            if problem is not None:
                raise CLIError(problem)


def target_files(args: argparse.Namespace) -> ModelFiles | None:
    """The target's files: the shipped demo pair's without -m, else what -m names (None: not readable yet)."""
    if args.model is None:
        directory = model_files.demo_directory("target") if args.demo_pair == "shipped" else None
        return None if directory is None else model_files.from_directory(directory, "the demo target", "-m/--model")
    return model_files.locate(args.model, "-m/--model")


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


def check_default_draft(args: argparse.Namespace, target: ModelFiles) -> None:
    """-m without a drafter: the family's default draft where it suits and is on this machine, else suffix decoding
    (`loading.default_drafting`, decided from the files: no download, no torch); kept on `args.default_drafting`
    for `session` to use."""
    if args.model is None or args.assistant_model is not None or args.no_assisted:
        return
    if args.prompt_lookup or args.assistant_early_exit or args.suffix_cache or "model_type" not in target.config:
        return
    if any(target.generation_config.get(field) for field in DRAFTER_FIELDS):  # a checkpoint may ask for these
        return
    args.default_drafting = default_drafting(args.model, target.config["model_type"], target.parameters)


def preflight(args: argparse.Namespace) -> None:
    """Everything that can be checked without loading a model; caches the prompt file's text on `args`."""
    for flag, path in (("--json", args.json), ("--csv", args.csv), ("--plot", args.plot)):
        if path is not None:
            check_output(path, flag)
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise CLIError(f"--plot needs matplotlib: {INSTALL_PLOT}; or drop --plot")
    args.prompt_text = read_prompt_file(args.prompt_file) if args.prompt_file is not None else None
    check_prompt(args)
    check_model_path(args.model, "-m/--model")
    check_model_path(args.assistant_model, "--assistant-model")
    check_device(args)
    target = target_files(args)
    if target is not None:
        check_target(args, target)
        check_default_draft(args, target)
    if args.assistant_model is not None:
        model_files.locate(args.assistant_model, "--assistant-model")

"""Checks of the model and device flags both command lines take, run before any model loads (and before torch is
imported): `-m` pointing at a file, a device this machine does not have, a dtype its CPU would emulate, a model
directory without weights or tokenizer, a Hub id that is not cached on an offline machine, `--assistant-model`'s
files; and the default draft, decided from the target's files.

Each problem is one line naming the flag and the fix, so a long run never fails at its end.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from assisted_backends.options.fields import DRAFTER_FIELDS
from assisted_backends.startup import machine, model_files
from assisted_backends.startup.default_draft import default_drafting
from assisted_backends.startup.errors import CLIError
from assisted_backends.startup.model_files import ModelFiles


def check_model_path(name: str | None, flag: str) -> None:
    """An absolute or ./~ path must exist, and a plain file must be a .gguf (Hub ids are checked on loading)."""
    if name is None:
        return
    path = Path(name).expanduser()
    if (path.is_absolute() or name.startswith((".", "~"))) and not path.exists():  # a path, not a Hub id
        raise CLIError(f"{flag} directory {name} does not exist; give a model directory, a .gguf file or a Hub id")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise CLIError(f"{flag} {name}: is a file, not a model; give a model directory, a .gguf file or a Hub id")


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


def check_default_draft(args: argparse.Namespace, target: ModelFiles) -> None:
    """-m without a drafter: the family's default draft where it suits and is on this machine, else suffix decoding
    (`startup.default_draft`, decided from the files: no download, no torch); kept on `args.default_drafting`
    for `session` to use."""
    if args.model is None or args.assistant_model is not None or args.no_assisted:
        return
    if args.prompt_lookup or args.assistant_early_exit or args.suffix_cache or "model_type" not in target.config:
        return
    if any(target.generation_config.get(field) for field in DRAFTER_FIELDS):  # a checkpoint may ask for these
        return
    args.default_drafting = default_drafting(target.config["model_type"], target.parameters)


def read_models(args: argparse.Namespace) -> ModelFiles | None:
    """The model paths and the device checked, then the target's files read (None: not readable before loading)."""
    check_model_path(args.model, "-m/--model")
    check_model_path(args.assistant_model, "--assistant-model")
    check_device(args)
    return target_files(args)


def check_drafting_files(args: argparse.Namespace, target: ModelFiles | None) -> None:
    """The default draft decided from the target's files, and `--assistant-model`'s files read."""
    if target is not None:
        check_default_draft(args, target)
    if args.assistant_model is not None:
        model_files.locate(args.assistant_model, "--assistant-model")

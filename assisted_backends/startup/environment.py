"""The process's settings that must be made before torch and transformers load (both command lines call it once
their flags are checked)."""

from __future__ import annotations

import argparse
import os
import sys

from assisted_backends.startup.threads import set_wait_policy


def quiet_libraries(args: argparse.Namespace) -> None:
    """Before torch and transformers load: OpenMP's wait policy (`startup.threads`, kept on `args.wait_policy` for
    the report), and transformers' progress bars and info logs off unless `args.verbose`. A call from a process that
    loaded torch already (tests, a notebook) changes nothing: OpenMP has read its settings, and that process's
    logging is its own."""
    if "torch" in sys.modules:
        args.wait_policy = "unchanged (torch was loaded before the command started)"
        return
    args.wait_policy = set_wait_policy()
    if not getattr(args, "verbose", False):
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")  # bars that pass no `disable=` (GGUF conversion); ours pass it

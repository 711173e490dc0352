"""The `run-assisted-generation` command (also `python -m assisted_backends.cli`)."""

from assisted_backends.cli.main import main

__all__ = ["main"]

"""The CLI's user-facing error (no heavy imports, so flag checks stay fast)."""


class CLIError(Exception):
    """A user-facing problem: printed as one line, exit status 2."""

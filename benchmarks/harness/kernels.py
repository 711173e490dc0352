"""The package's kernels for the benchmarks that time them: their status, or an exit naming why they do not run."""

from __future__ import annotations

from assisted_backends.native import extension


def require_kernels() -> extension.KernelStatus:
    """The kernels' status (`status.line()` names the path that runs); SystemExit with the reason where they do not."""
    status = extension.status()
    if not status.available:
        raise SystemExit(f"the package's kernels do not run here: {status.reason}")
    return status

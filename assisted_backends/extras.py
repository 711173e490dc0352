"""How to install an optional extra, said the same way by every error that needs one (no heavy imports)."""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """The command that adds `extra` (the package installs from a checkout: its extras from there)."""
    return f'pip install -e ".[{extra}]" from a checkout of assisted_backends'

"""Model directories for the command line's checks that read files only (no weights are loaded)."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

SEVEN_B_LLAMA = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False)  # fmt: skip


def claiming_7b(source: Path) -> Path:
    """A copy of the saved Llama directory `source` whose config.json states a 7B Llama's sizes: larger than its
    family's default draft, so the CLI's file checks reach the question whether that draft is on this machine."""
    target = source.parent / f"{source.name}-claims-7b"
    if not target.is_dir():
        shutil.copytree(source, target)
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, **SEVEN_B_LLAMA}, indent=2))
    return target


def interruptible() -> None:
    """`preexec_fn` for a child that a test interrupts: SIGINT back to its default, so that the child's Python
    raises KeyboardInterrupt even where the test runs in a shell's background job (which ignores SIGINT, and
    its children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

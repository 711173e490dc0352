"""The native decoder step (`decoder/decoder.cpp`): built on first use beside the kernels, cached, loaded as a module.

A library of its own (its source hash, its cache folder `<cache>/decoder/<key>/`), so the decoder and the kernels
never rebuild each other. It calls the kernels (`block_linear`, `row_attention`) through torch's dispatcher, so the
kernels' library must be loaded first: `module()` asks `extension.status()` for that and builds nothing where the
kernels do not run. `ASSISTED_BACKENDS_NATIVE=off` switches the decoder off (the run keeps transformers' modeling
on the kernels).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

from assisted_backends.cache_dir import cache_root
from assisted_backends.native import extension

SOURCE = Path(__file__).with_name("decoder") / "decoder.cpp"
SWITCH_VARIABLE = "ASSISTED_BACKENDS_NATIVE"
_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fopenmp"]  # no FMA may change an fp32 op's rounding
_NAME = "assisted_backends_decoder"


def switched_off() -> str:
    """Why the environment turns the native decoder off ('' when it does not)."""
    raw = os.environ.get(SWITCH_VARIABLE, "").strip().lower()
    if raw in ("", "on", "auto", "1"):
        return ""
    if raw in ("off", "0", "no"):
        return f"{SWITCH_VARIABLE}={raw}"
    raise ValueError(f"{SWITCH_VARIABLE}={raw!r} is not one of on, off (or unset: on where it covers the model)")


def build_key() -> str:
    digest = hashlib.sha256(" ".join(_FLAGS).encode())
    for path in sorted(SOURCE.parent.iterdir()):  # decoder.cpp and the headers it includes
        digest.update(path.name.encode() + path.read_bytes())
    digest = digest.hexdigest()[:12]
    return f"{digest}-torch{torch.__version__}".replace("+", "_").replace("/", "_")


def why_unavailable() -> str:
    """'' where the decoder can be built or loaded here, else one sentence why not."""
    off = switched_off()
    if off:
        return off
    if not extension.available():
        return f"the package's kernels do not run here ({extension.status().reason})"
    return _built()[1]


def module():
    """The compiled module (`Decoder`, `make_linear`); raises RuntimeError with the reason where unavailable."""
    why = why_unavailable()
    if why:
        raise RuntimeError(f"the native decoder is unavailable: {why}")
    return _built()[0]


@functools.lru_cache(maxsize=1)
def _built():
    """(module, '') once built and loaded, or (None, why not): once per process."""
    from torch.utils import cpp_extension

    directory = cache_root() / "decoder" / build_key()
    directory.mkdir(parents=True, exist_ok=True)
    fresh = not any(directory.glob(f"{_NAME}*.so"))
    started = time.perf_counter()
    if fresh:
        print(f"assisted_backends: building the native decoder once (cached in {directory}) ...", file=sys.stderr,
              flush=True)  # fmt: skip
    try:
        loaded = cpp_extension.load(
            name=_NAME,
            sources=[str(SOURCE)],
            extra_cflags=_FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
    except Exception as error:  # a failed build leaves transformers' modeling on the kernels, with the reason
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return None, f"the native decoder did not build: {first[:200]}"
    if fresh:
        print(f"assisted_backends: native decoder built in {time.perf_counter() - started:.0f} s", file=sys.stderr,
              flush=True)  # fmt: skip
    return loaded, ""

"""The native decoder step (`decoder/decoder.cpp`): built on first use beside the kernels, cached, loaded as a module.

A library of its own (`DECODER`: its sources' and headers' hash, its cache folder `<cache>/decoder/<key>/`), built
by the same machinery as the kernels (`extension.build_library`: one builder at a time, a failed build remembered
with the compiler's first error), so the decoder and the kernels never rebuild each other, except through the headers
they share (`csrc/row_math.h`: the fp16 conversion, the exp, the 8-lane tree; `csrc/block_layout.h`: the reader of
the stored codes), which both keys hash. It calls the kernels (`block_linear`, `cache_attention`) through torch's
dispatcher, so the kernels' library must be loaded first: `module()` asks
`extension.status()` for that and builds nothing where the kernels do not run. `ASSISTED_BACKENDS_NATIVE=off`
switches the decoder off (the run keeps transformers' modeling on the kernels).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from assisted_backends.native import extension

FOLDER = Path(__file__).with_name("decoder")
SOURCE = FOLDER / "decoder.cpp"
HEADERS = (extension.CSRC / "row_math.h", extension.CSRC / "block_layout.h")
SWITCH_VARIABLE = "ASSISTED_BACKENDS_NATIVE"
_NAME = "assisted_backends_decoder"
# -ffp-contract=off: no FMA may change an fp32 op's rounding (the kernels' flags)
DECODER = extension.Build(_NAME, "decoder", (SOURCE,), HEADERS, python_module=True, what="the native decoder")


def switched_off() -> str:
    """Why the environment turns the native decoder off ('' when it does not)."""
    raw = os.environ.get(SWITCH_VARIABLE, "").strip().lower()
    if raw in ("", "on", "auto", "1"):
        return ""
    if raw in ("off", "0", "no"):
        return f"{SWITCH_VARIABLE}={raw}"
    raise ValueError(f"{SWITCH_VARIABLE}={raw!r} is not one of on, off (or unset: on where it covers the model)")


def build_key() -> str:
    """The decoder's build: its source's and headers' hash, the flags, the compiler, torch, the CPU's flags."""
    return extension.build_key(DECODER.sources, DECODER.headers, DECODER.flags)


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
    loaded, why = extension.build_library(DECODER)
    return (loaded, "") if loaded else (None, why)

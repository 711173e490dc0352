"""intel-extension-for-pytorch (IPEX), where it is installed and can load into this torch.

IPEX is archived upstream: 2.8 is its last release and it refuses to load unless torch's major.minor
matches its own, so it is never required. Choose with the environment variable
`ASSISTED_BACKENDS_IPEX`:

- `auto` (default): use IPEX for bf16 models when it loads; fp32 models run natively. On this
  machine `ipex.optimize` made bf16 decode steps faster and fp32 ones no faster
  (benchmarks/results/xeon_ipex.json), so auto takes the faster path for each precision.
- `on`: use it for every model the CPU backend prepares (fp32 too); a clear error when it cannot load.
- `off`: never import it.

What is used is `ipex.optimize` (prepacked oneDNN linear weights, fused ops) on the target and on a
bf16/fp32 draft; the model keeps transformers' own forward, so the core's dynamic and static KV caches
and their rollback work unchanged. `ipex.llm.optimize` is not used: it swaps attention for kernels that
read IPEX's own preallocated cache (IndirectAccessKVCache), whose length is kept apart from the
tokens and which the core cannot roll back through transformers' Cache API. w8af32 drafts are left to
PyTorch's int8 kernels (see quantize.py).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from dataclasses import dataclass

import torch

from assisted_backends.extras import install_hint

ENV = "ASSISTED_BACKENDS_IPEX"
MODES = ("auto", "on", "off")
MODULE = "intel_extension_for_pytorch"
DISTRIBUTION = "intel-extension-for-pytorch"
PREPARED_ATTRIBUTE = "_assisted_backends_ipex"


class IpexUnavailableError(RuntimeError):
    """IPEX was asked for (ASSISTED_BACKENDS_IPEX=on) but cannot load here."""


@dataclass(frozen=True)
class IpexStatus:
    """Whether IPEX can load into this torch, without importing it."""

    loadable: bool
    version: str | None
    reason: str


def requested_mode() -> str:
    """The mode `ASSISTED_BACKENDS_IPEX` asks for ("auto" when unset)."""
    return mode_of(os.environ.get(ENV))


@functools.cache
def mode_of(value: str | None) -> str:
    """The mode a value of `ASSISTED_BACKENDS_IPEX` asks for (None: unset, "auto"); a ValueError naming the choices."""
    mode = (value or "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV}={value!r} is not one of {MODES}")
    return mode


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def status() -> IpexStatus:
    """Installed? Matching torch? Read from package metadata only: IPEX exits the process on a mismatch."""
    if importlib.util.find_spec(MODULE) is None:
        return IpexStatus(False, None, f"{DISTRIBUTION} is not installed ({install_hint('xeon')}, on torch 2.8)")
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is not None and _major_minor(version) != _major_minor(torch.__version__):
        return IpexStatus(
            False,
            version,
            f"{DISTRIBUTION} {version} only loads into torch {'.'.join(_major_minor(version))}.x; "
            f"this is torch {torch.__version__}",
        )
    return IpexStatus(True, version, f"{DISTRIBUTION} {version} matches torch {torch.__version__}")


@functools.cache
def native(mode: str, dtype: torch.dtype | None) -> tuple[bool, str] | None:
    """`wanted`'s answer where it needs no `status()`: IPEX is off, or `auto` leaves `dtype` to PyTorch; else None."""
    if mode == "off":
        return False, f"not used: {ENV}=off"
    if mode == "auto" and dtype != torch.bfloat16:
        return False, f"not used for {dtype or 'the model dtype'}: no faster than native here ({ENV}=on forces it)"
    return None


def wanted(mode: str, dtype: torch.dtype | None, current: IpexStatus | None) -> tuple[bool, str]:
    """Whether to use IPEX for a model that will run in `dtype`, and why (one line for describe()); `current`
    is read only where `native` has no answer."""
    decided = native(mode, dtype)
    if decided is not None:
        return decided
    if mode == "on":
        if not current.loadable:
            raise IpexUnavailableError(
                f"{ENV}=on asks for intel-extension-for-pytorch, but {current.reason}. Unset {ENV} "
                f"(or set it to 'off') to run the native path"
            )
        return True, f"used ({ENV}=on; {current.reason})"
    if not current.loadable:
        return False, f"not used: {current.reason}"
    return True, f"used for bf16 ({current.reason}; measured faster than native bf16 here)"


def load():
    """Import IPEX (after `status()` said it can load). Import errors surface as IpexUnavailableError."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(MODULE)
    except Exception as error:  # any failure inside IPEX's import means "cannot use it"
        raise IpexUnavailableError(f"importing {MODULE} failed: {type(error).__name__}: {error}") from error


def optimize(model: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
    """`ipex.optimize` for inference, in place; a model already optimized is returned as it is."""
    if getattr(model, PREPARED_ATTRIBUTE, False):
        return model
    ipex = load()
    low_precision = dtype if dtype in (torch.bfloat16, torch.float16) else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = ipex.optimize(model.eval(), dtype=low_precision, inplace=True)
    setattr(optimized, PREPARED_ATTRIBUTE, True)
    return optimized

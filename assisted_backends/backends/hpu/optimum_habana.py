"""Gaudi through optimum-habana: the modeling Gaudi users already run, where it is installed.

Supported: optimum-habana 1.21.x (>= 1.21.0, < 1.22; 1.21 pins transformers >= 4.55, < 4.56). With
`ASSISTED_BACKENDS_OPTIMUM_HABANA=on` the HPU backend:
- calls `optimum.habana.transformers.modeling_utils.adapt_transformers_to_gaudi()` once per process,
  when the backend is created: models loaded after that (the CLI resolves the backend first) are
  optimum-habana's Gaudi classes (fused RoPE/RMSNorm/SDPA, HPU-friendly masks);
- loads them in bf16, as optimum-habana's text-generation example does with `--bf16`;
- passes the Gaudi forward options that example passes (only those the model's forward takes):
  `lazy_mode` (from PT_HPU_LAZY_MODE), `attn_softmax_bf16=True` in bf16, and `reuse_cache=False`;
- hands them their KV cache as tuples (`_supports_cache_class = False`: the runner's LegacyCache):
  optimum-habana 1.21's Gaudi models read and return tuple caches ("HPU uses legacy cache path") and
  take no transformers StaticCache. optimum-habana's own preallocated cache (`reuse_cache=True`,
  written at `token_idx`) is not used, so a rejected draft rolls back by slicing.
The price: the cache grows each step, so HPU graphs see one shape per length. That is why the path
is opt-in: unset (`auto`), a supported optimum-habana is detected and reported by `describe()` but
transformers' modeling and the package's static cache stay; `off` does not look; `on` makes a missing
or unsupported optimum-habana an error. Nothing here imports optimum-habana unless the HPU backend is
in use.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass

import torch

SUPPORTED = ((1, 21), (1, 22))  # [1.21, 1.22)
SUPPORTED_TEXT = "optimum-habana 1.21.x (>=1.21.0,<1.22; it pins transformers 4.55)"
ENV = "ASSISTED_BACKENDS_OPTIMUM_HABANA"
_ADAPTED: list[str] = []  # the version adapted in this process, once


@dataclass(frozen=True)
class Modeling:
    """Which modeling path the HPU backend takes, and why."""

    optimum: bool
    version: str | None
    reason: str

    def describe(self) -> str:
        if self.optimum:
            return f"optimum-habana {self.version} (adapt_transformers_to_gaudi)"
        return f"transformers ({self.reason})"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _installed_version(module) -> str | None:
    version = getattr(module, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version("optimum-habana")
        except metadata.PackageNotFoundError:
            return None
    return str(version)


def detect(environ: dict[str, str] | None = None) -> Modeling:
    """The path to take, from ASSISTED_BACKENDS_OPTIMUM_HABANA (auto | on | off) and what is installed."""
    environ = os.environ if environ is None else environ
    setting = environ.get(ENV, "auto")
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"{ENV}={setting!r} must be 'auto', 'on' or 'off'")
    if setting == "off":
        return Modeling(False, None, f"{ENV}=off")
    try:
        module = importlib.import_module("optimum.habana")
    except ImportError:
        if setting == "on":
            raise ImportError(
                f"{ENV}=on but optimum-habana is not installed: pip install 'optimum-habana>=1.21,<1.22'"
            ) from None
        return Modeling(False, None, "optimum-habana not installed")
    version = _installed_version(module) or "unknown"
    low, high = SUPPORTED
    if not low <= _version_tuple(version)[:2] < high:
        message = f"optimum-habana {version} is installed; supported is {SUPPORTED_TEXT}"
        if setting == "on":
            raise NotImplementedError(f"{message}; install that range or set {ENV}=off")
        return Modeling(False, version, f"{message}: using transformers modeling")
    if setting == "auto":
        return Modeling(False, version, f"optimum-habana {version} is installed; {ENV}=on uses its modeling")
    return Modeling(True, version, "adapt_transformers_to_gaudi")


def adapt_once(modeling: Modeling) -> None:
    """optimum-habana's `adapt_transformers_to_gaudi()`, once per process (it patches transformers)."""
    if not modeling.optimum or _ADAPTED:
        return
    importlib.import_module("optimum.habana.transformers.modeling_utils").adapt_transformers_to_gaudi()
    _ADAPTED.append(str(modeling.version))


def is_gaudi_model(model: torch.nn.Module) -> bool:
    """Whether `model` is one of optimum-habana's classes (loaded after adapt_transformers_to_gaudi)."""
    return type(model).__module__.startswith("optimum.habana.")


def use_tuple_cache(model: torch.nn.Module) -> None:
    """Make the runner hand `model` tuple caches (hf_compat.LegacyCache), as optimum-habana's classes need."""
    model._supports_cache_class = False


def forward_options(model: torch.nn.Module, lazy: bool, dtype: torch.dtype) -> dict[str, bool]:
    """The Gaudi forward options optimum-habana's text-generation example passes, where `model` takes them."""
    wanted = {"lazy_mode": lazy, "attn_softmax_bf16": dtype == torch.bfloat16, "reuse_cache": False}
    accepted = inspect.signature(type(model).forward).parameters
    return {name: value for name, value in wanted.items() if name in accepted}


def with_options(forward, options: dict[str, bool]):
    """`forward` with `options` added to every call (the caller's own keywords win)."""
    if not options:
        return forward

    def call(*args, **kwargs):
        return forward(*args, **{**options, **kwargs})

    call.__wrapped__ = forward
    return call

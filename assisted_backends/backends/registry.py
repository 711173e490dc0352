"""Backend discovery through the `assisted_backends.backends` entry-point group.

Each entry point's name is a device name and its object a `Backend` subclass. A third-party package
adds a device by declaring one more entry point; nothing here changes. An explicit device beats
auto-detection, and two usable backends for one device name are an error, not a coin toss.

Backends are probed lazily: a device name's classes are imported when that name is looked up, and the
built-in CUDA and HPU backends are not looked up at all where their hardware is ruled out by a probe
that needs no backend code (`PRESENCE`), so a CPU run imports and executes no CUDA or HPU backend code.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points

import torch

from assisted_backends.backends.base import Backend, BackendOptions
from assisted_backends.options.errors import OptionError

ENTRY_POINT_GROUP = "assisted_backends.backends"

# Used only when the package runs from a source tree that was never installed (no metadata).
_BUILTIN = {
    "cpu": "assisted_backends.backends.cpu.backend:CPUBackend",
    "cuda": "assisted_backends.backends.cuda.backend:CUDABackend",
    "hpu": "assisted_backends.backends.hpu.backend:HPUBackend",
}


def _habana_installed() -> bool:
    return importlib.util.find_spec("habana_frameworks") is not None  # looks, does not import


# Built-in backends whose hardware can be ruled out before their module is imported: False means the
# backend cannot be usable here; True means it may be, and its own `is_available()` decides.
PRESENCE: dict[str, Callable[[], bool]] = {
    _BUILTIN["cuda"]: torch.cuda.is_available,
    _BUILTIN["hpu"]: _habana_installed,
}


class DeviceUnavailableError(OptionError, RuntimeError):
    """The requested device exists as a backend but cannot run on this machine."""


def _load(spec: str) -> type[Backend]:
    module_name, _, attribute = spec.partition(":")
    module = __import__(module_name, fromlist=[attribute])
    return getattr(module, attribute)


class Registered(Mapping[str, list[type[Backend]]]):
    """Backend classes by device name, a name's classes imported on its first lookup."""

    def __init__(self, specs: dict[str, list[EntryPoint | str]]) -> None:
        self._specs = specs
        self._loaded: dict[str, list[type[Backend]]] = {}

    def __getitem__(self, name: str) -> list[type[Backend]]:
        if name not in self._loaded:
            classes: list[type[Backend]] = []
            for spec in self._specs[name]:
                backend = spec.load() if isinstance(spec, EntryPoint) else _load(spec)
                if backend not in classes:
                    classes.append(backend)
            self._loaded[name] = classes
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def may_be_usable(self, name: str) -> bool:
        """False when every class registered under `name` is a built-in whose hardware probe says no."""
        for spec in self._specs[name]:
            value = spec.value if isinstance(spec, EntryPoint) else spec
            if value not in PRESENCE or PRESENCE[value]():
                return True
        return False


@lru_cache(maxsize=1)
def discover() -> Registered:
    """Every registered backend class, by device name (scanned once per process; `discover.cache_clear()` rescans)."""
    specs: dict[str, list[EntryPoint | str]] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        specs.setdefault(entry.name, []).append(entry)
    for name, spec in _BUILTIN.items():
        specs.setdefault(name, [spec])
    return Registered(specs)


def _single_usable(name: str, candidates: list[type[Backend]]) -> type[Backend] | None:
    usable = [backend for backend in candidates if backend.is_available()]
    if len(usable) > 1:
        names = ", ".join(f"{b.__module__}.{b.__qualname__}" for b in usable)
        raise RuntimeError(
            f"two usable backends claim device {name!r} ({names}); uninstall one of the packages providing them"
        )
    return usable[0] if usable else None


def resolve_backend(device: str = "auto", options: BackendOptions | None = None) -> Backend:
    """The backend for `device` ('auto' picks the usable one with the highest priority)."""
    registered = discover()
    if device == "auto":
        usable = [
            backend
            for name in registered
            if registered.may_be_usable(name) and (backend := _single_usable(name, registered[name])) is not None
        ]
        return max(usable, key=lambda backend: backend.priority)(options)
    if device not in registered:
        known = ", ".join(["auto", *sorted(registered)])
        raise OptionError(f"{{name}} is unknown; choose one of: {known}", name=("device", device))
    backend = _single_usable(device, registered[device]) if registered.may_be_usable(device) else None
    if backend is None:
        raise DeviceUnavailableError(
            f"{{name}} is not available: {registered[device][0].unavailable_reason()}", name=("device", device)
        )
    return backend(options)

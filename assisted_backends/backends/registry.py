"""Backend discovery through the `assisted_backends.backends` entry-point group.

Each entry point's name is a device name and its object a `Backend` subclass. A third-party package
adds a device by declaring one more entry point; nothing here changes. An explicit device beats
auto-detection, and two usable backends for one device name are an error, not a coin toss.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import entry_points

from assisted_backends.backends.base import Backend, BackendOptions
from assisted_backends.options.errors import OptionError

ENTRY_POINT_GROUP = "assisted_backends.backends"

# Used only when the package runs from a source tree that was never installed (no metadata).
_BUILTIN = {
    "cpu": "assisted_backends.backends.cpu.backend:CPUBackend",
    "cuda": "assisted_backends.backends.cuda.backend:CUDABackend",
    "hpu": "assisted_backends.backends.hpu.backend:HPUBackend",
}


class DeviceUnavailableError(OptionError, RuntimeError):
    """The requested device exists as a backend but cannot run on this machine."""


def _load(spec: str) -> type[Backend]:
    module_name, _, attribute = spec.partition(":")
    module = __import__(module_name, fromlist=[attribute])
    return getattr(module, attribute)


@lru_cache(maxsize=1)
def discover() -> dict[str, list[type[Backend]]]:
    """Every registered backend class, by device name (scanned once per process; `discover.cache_clear()` rescans)."""
    found: dict[str, list[type[Backend]]] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        backend = entry.load()
        if backend not in found.setdefault(entry.name, []):
            found[entry.name].append(backend)
    for name, spec in _BUILTIN.items():
        if name not in found:
            found[name] = [_load(spec)]
    return found


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
        usable = [b for name, group in registered.items() if (b := _single_usable(name, group)) is not None]
        return max(usable, key=lambda backend: backend.priority)(options)
    if device not in registered:
        known = ", ".join(["auto", *sorted(registered)])
        raise OptionError(f"{{name}} is unknown; choose one of: {known}", name=("device", device))
    backend = _single_usable(device, registered[device])
    if backend is None:
        raise DeviceUnavailableError(
            f"{{name}} is not available: {registered[device][0].unavailable_reason()}", name=("device", device)
        )
    return backend(options)

"""Device backends, discovered through the `assisted_backends.backends` entry-point group."""

from assisted_backends.backends.base import Backend, BackendOptions, PaddingPolicy
from assisted_backends.backends.registry import DeviceUnavailableError, resolve_backend

__all__ = ["Backend", "BackendOptions", "DeviceUnavailableError", "PaddingPolicy", "resolve_backend"]

"""Backends come from the entry-point group; third parties add one without touching this package."""

import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest
import torch

from assisted_backends.backends import Backend, registry, resolve_backend
from assisted_backends.backends.cpu.backend import CPUBackend


class PluginBackend(Backend):
    """A third-party backend as a plugin package would declare it (runs on the CPU)."""

    name = "plugin"
    priority = 5

    @classmethod
    def is_available(cls) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def prepare(self, model, role):
        return model.eval()


class SecondCPUBackend(CPUBackend):
    """Another usable backend claiming the 'cpu' device name."""


def _with_entry_points(monkeypatch, *extra: EntryPoint) -> None:
    original = registry.entry_points

    def patched(group: str):
        return [*original(group=group), *extra]

    monkeypatch.setattr(registry, "entry_points", patched)
    registry.discover.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_discovery():
    registry.discover.cache_clear()
    yield
    registry.discover.cache_clear()


def test_cpu_is_registered_through_the_entry_point_group():
    assert [ep.name for ep in registry.entry_points(group=registry.ENTRY_POINT_GROUP) if ep.name == "cpu"] == ["cpu"]
    assert isinstance(resolve_backend("cpu"), CPUBackend)


def test_a_plugin_entry_point_is_discovered_and_wins_auto_by_priority(monkeypatch):
    _with_entry_points(monkeypatch, EntryPoint("plugin", f"{__name__}:PluginBackend", registry.ENTRY_POINT_GROUP))
    assert isinstance(resolve_backend("plugin"), PluginBackend)
    assert isinstance(resolve_backend("auto"), PluginBackend)


def test_two_usable_backends_for_one_device_is_an_error(monkeypatch):
    _with_entry_points(monkeypatch, EntryPoint("cpu", f"{__name__}:SecondCPUBackend", registry.ENTRY_POINT_GROUP))
    with pytest.raises(RuntimeError, match="two usable backends claim device 'cpu'"):
        resolve_backend("cpu")


def test_auto_picks_cpu_when_nothing_else_is_usable():
    assert resolve_backend("auto").name in {"cpu", *registry.discover()}


def test_importing_the_package_imports_no_vendor_library():
    code = (
        "import sys, assisted_backends, assisted_backends.backends.registry as r; r.discover(); "
        "bad = [m for m in ('habana_frameworks', 'intel_extension_for_pytorch', 'deepspeed', 'optimum') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr

"""FAKE `habana_frameworks`: a recording stand-in for the Intel Gaudi PyTorch bridge (tests only).

Nothing here talks to a Gaudi. It serves the module names and functions the HPU backend uses, with
the real signatures, and records what was called so tests can check the backend's conformance:
- `habana_frameworks.torch.core.mark_step()`
- `habana_frameworks.torch.hpu`: `is_available`, `synchronize`, `wrap_in_hpu_graph`, `memory_allocated`,
  `max_memory_allocated`, `random.manual_seed`
- `habana_frameworks.torch.utils.internal.is_lazy()`
- the "hpu_backend" torch.compile backend (registered when `habana_frameworks.torch` is imported,
  as the real bridge does); it records each compiled graph and runs it eagerly.

`wrap_in_hpu_graph` replaces `module.forward` like the real one, keys "graphs" the way the real one
does (shape/dtype/device of every tensor argument, hash of every other argument) and honours
`bypass_hpu_graphs=True`; it runs the original forward every time and counts captures and replays.

The fake is served through an import hook installed by `install()`, so every import of a
`habana_frameworks` module is recorded too; `uninstall()` removes the hook and the modules.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import sys
import types
from dataclasses import dataclass, field

import torch

PACKAGE = "habana_frameworks"
_MODULES = (
    PACKAGE,
    f"{PACKAGE}.torch",
    f"{PACKAGE}.torch.core",
    f"{PACKAGE}.torch.hpu",
    f"{PACKAGE}.torch.hpu.random",
    f"{PACKAGE}.torch.utils",
    f"{PACKAGE}.torch.utils.internal",
)


def _signature(value) -> object:
    """What the real wrap_in_hpu_graph hashes: tensor metadata, or the object itself."""
    if isinstance(value, dict):
        return tuple((key, _signature(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_signature(item) for item in value)
    if torch.is_tensor(value):
        return (tuple(value.shape), value.dtype, value.device.type)
    return ("object", id(value)) if not isinstance(value, (int, float, str, bool, type(None))) else value


@dataclass
class FakeHabana:
    """The recording: `calls` in order, `imports` of fake modules, HPU-graph captures per wrapped module."""

    device_present: bool = True
    lazy: bool = True
    calls: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    wrapped: list[torch.nn.Module] = field(default_factory=list)
    captured: dict[int, list[object]] = field(default_factory=dict)  # id(module) -> signatures captured
    replays: dict[int, int] = field(default_factory=dict)
    bypassed: dict[int, int] = field(default_factory=dict)
    compiled_graphs: int = 0

    def count(self, name: str) -> int:
        return self.calls.count(name)

    # -- the fake API ------------------------------------------------------------------------

    def mark_step(self) -> None:
        self.calls.append("mark_step")

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def is_available(self) -> bool:
        self.calls.append("is_available")
        return self.device_present

    def is_lazy(self) -> bool:
        return self.lazy

    def manual_seed(self, seed: int) -> None:
        self.calls.append("manual_seed")
        self.seeds.append(seed)

    def memory_allocated(self) -> int:
        return 1024

    def max_memory_allocated(self) -> int:
        return 2048

    def wrap_in_hpu_graph(self, module, asynchronous=False, disable_tensor_cache=False, dry_run=False, max_graphs=None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError("wrap_in_hpu_graph expects a torch.nn.Module")
        self.calls.append("wrap_in_hpu_graph")
        self.wrapped.append(module)
        key = id(module)
        graphs: dict[object, bool] = {}
        self.captured[key], self.replays[key], self.bypassed[key] = [], 0, 0
        original = module.forward

        def forward(*args, **kwargs):
            if kwargs.pop("bypass_hpu_graphs", False):
                self.bypassed[key] += 1
                return original(*args, **kwargs)
            signature = _signature((args, kwargs))
            if signature in graphs:
                self.replays[key] += 1
            else:
                graphs[signature] = True
                self.captured[key].append(signature)
            return original(*args, **kwargs)

        def clear_cache():
            self.calls.append("clear_cache")
            graphs.clear()

        module.forward = forward
        module.clear_cache = clear_cache
        return module

    def hpu_backend(self, graph_module, example_inputs):
        self.compiled_graphs += 1
        return graph_module.forward


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, fake: FakeHabana) -> None:
        self.fake = fake

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULES:
            return None
        is_package = fullname in (PACKAGE, f"{PACKAGE}.torch", f"{PACKAGE}.torch.hpu", f"{PACKAGE}.torch.utils")
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec):
        return types.ModuleType(spec.name, "FAKE habana_frameworks module (tests/fakes/habana_fake.py)")

    def exec_module(self, module) -> None:
        fake, name = self.fake, module.__name__
        fake.imports.append(name)
        if name == f"{PACKAGE}.torch":
            _register_compile_backend(fake)
        elif name == f"{PACKAGE}.torch.core":
            module.mark_step = fake.mark_step
        elif name == f"{PACKAGE}.torch.hpu":
            module.is_available = fake.is_available
            module.synchronize = fake.synchronize
            module.wrap_in_hpu_graph = fake.wrap_in_hpu_graph
            module.memory_allocated = fake.memory_allocated
            module.max_memory_allocated = fake.max_memory_allocated
        elif name == f"{PACKAGE}.torch.hpu.random":
            module.manual_seed = fake.manual_seed
        elif name == f"{PACKAGE}.torch.utils.internal":
            module.is_lazy = fake.is_lazy


_CURRENT: list[FakeHabana] = []  # the installed recording, if any


def _fake_hpu_backend(graph_module, example_inputs):
    if not _CURRENT:
        raise RuntimeError("the FAKE hpu_backend was used while no fake habana_frameworks is installed")
    return _CURRENT[0].hpu_backend(graph_module, example_inputs)


def _register_compile_backend(fake: FakeHabana) -> None:
    from torch._dynamo.backends import registry

    if "hpu_backend" not in registry._COMPILER_FNS:  # registered once per process, dispatching to _CURRENT
        torch._dynamo.register_backend(compiler_fn=_fake_hpu_backend, name="hpu_backend")


def install(**settings) -> FakeHabana:
    """Serve the fake `habana_frameworks` to imports from now on; returns the recording."""
    uninstall()
    fake = FakeHabana(**settings)
    _CURRENT.append(fake)
    sys.meta_path.insert(0, _Finder(fake))
    return fake


def uninstall() -> None:
    _CURRENT.clear()
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _Finder)]
    for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
        del sys.modules[name]


# ---------------------------------------------------------------------------------------------------------------
# FAKE `optimum.habana` (optimum-habana): the calls the HPU backend relies on, recorded.
# - `optimum.habana.__version__`
# - `optimum.habana.transformers.modeling_utils.adapt_transformers_to_gaudi()`: recorded, patches nothing.
# - `gaudi_class(cls)`: what adapt_transformers_to_gaudi makes `from_pretrained` return, a subclass living in
#   `optimum.habana...` whose forward takes the Gaudi options (token_idx, lazy_mode, attn_softmax_bf16,
#   reuse_cache, use_flash_attention) and records them; it then runs the transformers forward unchanged.

OPTIMUM = "optimum"
_OPTIMUM_MODULES = (
    OPTIMUM,
    f"{OPTIMUM}.habana",
    f"{OPTIMUM}.habana.transformers",
    f"{OPTIMUM}.habana.transformers.modeling_utils",
)
GAUDI_OPTIONS = ("token_idx", "lazy_mode", "attn_softmax_bf16", "reuse_cache", "use_flash_attention")


@dataclass
class FakeOptimumHabana:
    """The recording: adapt calls, imports, and the Gaudi options every forward of a `gaudi_class` model got."""

    version: str = "1.21.2"
    adapted: int = 0
    imports: list[str] = field(default_factory=list)
    forward_options: list[dict] = field(default_factory=list)
    tuple_caches: int = 0  # forwards that took and returned tuple caches, as optimum-habana 1.21's Gaudi models do

    def adapt_transformers_to_gaudi(self) -> None:
        self.adapted += 1

    def gaudi_class(self, cls: type) -> type:
        fake = self
        parameters = inspect.signature(cls.forward).parameters
        cache_name = "cache" if "cache" in parameters else "past_key_values"  # renamed in transformers 5.24

        def forward(module, *args, **kwargs):
            fake.forward_options.append({name: kwargs.pop(name) for name in GAUDI_OPTIONS if name in kwargs})
            past = kwargs.get(cache_name)
            if past is not None and not isinstance(past, (tuple, list)):
                raise TypeError("FAKE optimum-habana model: past_key_values must be tuples (HPU legacy cache path)")
            kwargs[cache_name] = _cache_from_tuples(past)
            output = cls.forward(module, *args, **kwargs)
            setattr(output, cache_name, _tuples_from_cache(getattr(output, cache_name)))
            fake.tuple_caches += 1
            return output

        forward.__signature__ = _with_gaudi_parameters(cls.forward)
        namespace = {"forward": forward, "__module__": f"{OPTIMUM}.habana.transformers.models.fake_modeling"}
        return type(f"Gaudi{cls.__name__}", (cls,), namespace)


def _cache_from_tuples(past):
    """The transformers cache the wrapped (transformers) forward needs, from optimum-habana's tuples."""
    from transformers import DynamicCache

    if past is None:
        return DynamicCache()
    if hasattr(DynamicCache, "from_legacy_cache"):  # transformers 4.x
        return DynamicCache.from_legacy_cache(tuple(past))
    return DynamicCache(ddp_cache_data=[(keys, values) for keys, values in past])


def _tuples_from_cache(cache) -> tuple:
    if hasattr(cache, "to_legacy_cache"):
        return cache.to_legacy_cache()
    return tuple((layer.keys, layer.values) for layer in cache.layers)


def _with_gaudi_parameters(function):
    import inspect

    signature = inspect.signature(function)
    parameters = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in GAUDI_OPTIONS]
    variadic = [p for p in signature.parameters.values() if p.kind == p.VAR_KEYWORD]
    return signature.replace(parameters=parameters + extra + variadic)


class _OptimumFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, fake: FakeOptimumHabana) -> None:
        self.fake = fake

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _OPTIMUM_MODULES:
            return None
        is_package = fullname != _OPTIMUM_MODULES[-1]
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec):
        return types.ModuleType(spec.name, "FAKE optimum-habana module (tests/fakes/habana_fake.py)")

    def exec_module(self, module) -> None:
        self.fake.imports.append(module.__name__)
        if module.__name__ == f"{OPTIMUM}.habana":
            module.__version__ = self.fake.version
        elif module.__name__ == _OPTIMUM_MODULES[-1]:
            module.adapt_transformers_to_gaudi = self.fake.adapt_transformers_to_gaudi


def install_optimum(**settings) -> FakeOptimumHabana:
    """Serve the fake `optimum.habana` to imports from now on; returns the recording."""
    uninstall_optimum()
    fake = FakeOptimumHabana(**settings)
    sys.meta_path.insert(0, _OptimumFinder(fake))
    return fake


def uninstall_optimum() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _OptimumFinder)]
    for name in [name for name in sys.modules if name == OPTIMUM or name.startswith(OPTIMUM + ".")]:
        del sys.modules[name]

"""Intel Gaudi (HPU) backend: bf16, static shapes always, HPU graphs in lazy mode, torch.compile in eager mode.

Static shapes are what make Gaudi fast: every distinct input shape is a graph compilation. So this
backend always answers with the static-shape policy of the base class (prompt left-padded to a
multiple of the bucket, static KV cache preallocated to a bucket multiple, the draft always
proposing exactly γ tokens, verification always [1, γ+1], rollback by moving the position), even
when the caller did not ask for `static_shapes=True`; the CPU backend runs that same policy on demand.

Execution mode comes from `PT_HPU_LAZY_MODE` (read by habana_frameworks at import, so set it
before the process starts):
- lazy (`1`): ops queue into a graph flushed by `habana_frameworks.torch.core.mark_step()`, called
  at every step boundary (after each forward). With graphs on (default), the target and the draft
  are wrapped by `habana_frameworks.torch.hpu.wrap_in_hpu_graph`: one captured graph per input
  signature, replayed after. Feeds of a whole bucket or more (prefills) bypass the graphs.
- eager (`0`): with graphs on, both models are compiled in place with
  `torch.compile(backend="hpu_backend")`; with graphs off they run op by op.

Modeling: with optimum-habana 1.21.x installed and ASSISTED_BACKENDS_OPTIMUM_HABANA=on, models are
prepared the way optimum-habana users run them (`adapt_transformers_to_gaudi()` when the backend is
created, bf16, its Gaudi forward options, tuple KV caches); `describe()["modeling"]` says which path
was taken and why (`backends/hpu/optimum_habana.py`).

habana_frameworks (and optimum-habana) are imported inside methods only, never when another device is chosen.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import weakref
from types import ModuleType
from typing import Literal

import torch

from assisted_backends.backends.base import Backend, BackendOptions, ModelRole, PaddingPolicy, named_dtype
from assisted_backends.backends.hpu import optimum_habana
from assisted_backends.extras import install_hint
from assisted_backends.options.errors import OptionError

ExecutionMode = Literal["lazy", "eager"]
DEFAULT_DTYPE = torch.bfloat16
_INSTALL_HINT = f"{install_hint('gaudi')} on a Gaudi host with the Intel Gaudi software stack"


def _vendor(submodule: str) -> ModuleType:
    """`habana_frameworks.torch.<submodule>`, imported on first use, with an install hint when missing."""
    try:
        return importlib.import_module(f"habana_frameworks.torch.{submodule}")
    except ImportError as error:
        raise ImportError(f"device='hpu' needs habana_frameworks ({error}); {_INSTALL_HINT}") from error


def execution_mode(environ: os._Environ | dict[str, str] | None = None) -> ExecutionMode:
    """'lazy' unless PT_HPU_LAZY_MODE=0 (habana_frameworks' own default is lazy when the variable is unset)."""
    environ = os.environ if environ is None else environ
    value = environ.get("PT_HPU_LAZY_MODE")
    if value is None:
        internal = _vendor("utils.internal")
        return "lazy" if getattr(internal, "is_lazy", lambda: True)() else "eager"
    if value not in ("0", "1"):
        raise ValueError(f"PT_HPU_LAZY_MODE={value!r} must be '0' (eager/compile) or '1' (lazy)")
    return "lazy" if value == "1" else "eager"


def resolve_dtype(requested: str | None, argument: str) -> torch.dtype:
    """bf16 unless asked otherwise ('auto' and None both mean the device's native bf16)."""
    if requested is None or requested == "auto":
        return DEFAULT_DTYPE
    return named_dtype(requested, argument, "hpu")


def _bypass_graphs_for_long_feeds(graphed_forward, bucket: int):
    """Call the HPU-graph forward with `bypass_hpu_graphs=True` for feeds of >= `bucket` tokens.

    Prefills (a whole padded prompt) run once per generation: capturing them costs memory and
    buys nothing. The test is on the host-side shape, so it never syncs with the device.
    """

    @functools.wraps(graphed_forward)
    def forward(*args, **kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is not None and input_ids.shape[-1] >= bucket:
            kwargs["bypass_hpu_graphs"] = True
        return graphed_forward(*args, **kwargs)

    return forward


class HPUBackend(Backend):
    name = "hpu"
    priority = 10
    device_type = "hpu"  # where tensors go (the CPU conformance tests use a subclass that says "cpu")

    def __init__(self, options: BackendOptions | None = None) -> None:
        super().__init__(options)
        self.dtype = resolve_dtype(self.options.dtype, "dtype")
        if self.options.draft_precision == "w8af32":
            raise OptionError("{name} is a CPU scheme; on hpu use 'bf16' or 'fp32'", name=("draft_precision", "w8af32"))
        self.draft_dtype = resolve_dtype(self.options.draft_precision or self.options.dtype, "draft_precision")
        self._mode: ExecutionMode | None = None
        self._prepared: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self.modeling = optimum_habana.detect()
        optimum_habana.adapt_once(self.modeling)  # before the models load: they become optimum-habana's classes
        self._model_classes: dict[str, str] = {}

    # ---------------------------------------------------------------- detection

    @classmethod
    def is_available(cls) -> bool:
        if importlib.util.find_spec("habana_frameworks") is None:  # looks, does not import
            return False
        try:
            hpu = importlib.import_module("habana_frameworks.torch.hpu")
        except ImportError:
            return False
        return bool(hpu.is_available())

    @classmethod
    def unavailable_reason(cls) -> str:
        if importlib.util.find_spec("habana_frameworks") is None:
            return f"habana_frameworks is not installed: {_INSTALL_HINT}"
        return "habana_frameworks is installed but sees no Gaudi device (check HABANA_VISIBLE_DEVICES and hl-smi)"

    @property
    def device(self) -> torch.device:
        return torch.device(self.device_type)

    @property
    def mode(self) -> ExecutionMode:
        if self._mode is None:
            self._mode = execution_mode()
        return self._mode

    @property
    def graphs_enabled(self) -> bool:
        return self.options.graphs is not False

    # ---------------------------------------------------------------- the questions the core asks

    def cache_layout(self) -> str:
        return "static"

    def padding(self, static_shapes: bool) -> PaddingPolicy:
        """Always the base class's static-shape policy: on Gaudi every new shape is a graph compile."""
        return super().padding(True)

    def prepare(self, model: torch.nn.Module, role: ModelRole) -> torch.nn.Module:
        """bf16 on hpu, eval mode, then HPU graphs (lazy) or torch.compile (eager). Idempotent.

        Called again at the start of each generation: the graphs captured for the previous one hold
        its KV cache and are dropped (`clear_cache`, set by wrap_in_hpu_graph), so they never pile up.
        """
        if model in self._prepared:
            clear = getattr(model, "clear_cache", None)
            if self._prepared[model] == "hpu_graphs" and callable(clear):
                clear()
            return model
        _vendor("core")  # loads the HPU bridge (and registers the "hpu_backend" compiler)
        dtype = self.dtype if role == "target" else self.draft_dtype
        model = model.to(device=self.device, dtype=dtype).eval()
        options = self._gaudi_options(model, role, dtype)
        wrapping = "none"
        if self.graphs_enabled and self.mode == "lazy":
            graphed = _vendor("hpu").wrap_in_hpu_graph(model)
            graphed.forward = _bypass_graphs_for_long_feeds(graphed.forward, self.padding(True).bucket)
            model, wrapping = graphed, "hpu_graphs"
        elif self.graphs_enabled:
            model.compile(backend="hpu_backend")  # in place: the model keeps its class and signature
            wrapping = "torch.compile"
        if options:
            model.forward = optimum_habana.with_options(model.forward, options)
        self._prepared[model] = wrapping
        return model

    def _gaudi_options(self, model: torch.nn.Module, role: ModelRole, dtype: torch.dtype) -> dict[str, bool]:
        """optimum-habana's forward options for its Gaudi classes; records which modeling each role got."""
        if not self.modeling.optimum:
            self._model_classes[role] = type(model).__name__
            return {}
        if not optimum_habana.is_gaudi_model(model):
            self._model_classes[role] = (
                f"{type(model).__name__} (transformers: loaded before the hpu backend was created)"
            )
            return {}
        optimum_habana.use_tuple_cache(model)
        options = optimum_habana.forward_options(model, self.mode == "lazy", dtype)
        self._model_classes[role] = f"{type(model).__name__} ({', '.join(f'{k}={v}' for k, v in options.items())})"
        return options

    def step_boundary(self) -> None:
        """Lazy mode: flush the queued ops of this forward as one graph."""
        if self.mode == "lazy":
            _vendor("core").mark_step()

    def synchronize(self) -> None:
        _vendor("hpu").synchronize()

    def generator(self, seed: int | None) -> torch.Generator | None:
        """Seed the host and HPU random generators; sampling then draws from the (seeded) global RNG."""
        if seed is not None:
            torch.manual_seed(seed)
            _vendor("hpu.random").manual_seed(seed)
        return None

    def memory_stats(self) -> dict[str, int]:
        hpu = _vendor("hpu")
        return {
            "memory_allocated_bytes": int(hpu.memory_allocated()),
            "max_memory_allocated_bytes": int(hpu.max_memory_allocated()),
        }

    def describe(self) -> dict[str, str]:
        graphs = "hpu_graphs" if self.mode == "lazy" else "torch.compile(backend='hpu_backend')"
        return {
            **super().describe(),
            "mode": f"{self.mode} (PT_HPU_LAZY_MODE={os.environ.get('PT_HPU_LAZY_MODE', 'unset')})",
            "graphs": graphs if self.graphs_enabled else "off",
            "dtype": str(self.dtype).removeprefix("torch."),
            "draft_dtype": str(self.draft_dtype).removeprefix("torch."),
            "draft_precision": str(self.draft_dtype).removeprefix("torch."),  # the key every backend reports
            "static_shapes": f"always (bucket {self.padding(True).bucket})",
            "modeling": self.modeling.describe(),
            **{f"{role}_class": name for role, name in self._model_classes.items()},
        }

"""CUDA backend: bf16 (fp16 where bf16 is unsupported), static KV cache, CUDA-graph-captured decode steps.

Choices, each overridable through `BackendOptions`:
- dtype: None keeps the model's own dtype; "auto" picks bf16, or fp16 on GPUs without bf16
  (`torch.cuda.is_bf16_supported()`); "fp32" / "bf16" / "fp16" are taken as given.
- layout: "static" (preallocated, rollback moves the device-side write position), so the draft's
  one-token step and the target's [1, γ+1] verification keep fixed shapes and addresses; models
  that declare host-side data-dependent control flow get the dynamic layout and eager steps.
- graphs (default on): those steps are captured with `torch.cuda.CUDAGraph` and replayed
  (`backends/cuda/graphs.py` holds the bookkeeping); `graphs=False` runs every step eagerly.
Everything used here is part of torch itself; no vendor library is imported.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from assisted_backends.backends.base import Backend, BackendOptions, ModelRole, named_dtype, unprepared
from assisted_backends.backends.cuda.graphs import GraphedCausalLM, GraphRuntime, graph_capturable

MAX_GRAPH_TOKENS = 16  # steps feeding more tokens than this (prefill) run eagerly


def choose_dtype(requested: str | None, model_dtype: torch.dtype, bf16_supported: bool, argument: str) -> torch.dtype:
    """The dtype for `requested` ("auto", a name in base.DTYPES, or None = keep `model_dtype`)."""
    if requested is None:
        return model_dtype
    if requested == "auto":
        return torch.bfloat16 if bf16_supported else torch.float16
    dtype = named_dtype(requested, argument, "cuda")
    if dtype == torch.bfloat16 and not bf16_supported:
        raise ValueError(f"{argument}='bf16' is not supported by this GPU; use {argument}='fp16' (or 'auto')")
    return dtype


class CUDAGraphRuntime:
    """`GraphRuntime` on CUDA: warm-up on a side stream, capture into a private memory pool.

    Each graph gets its own pool (the default of `torch.cuda.graph`): its intermediates can never
    alias another graph's, whatever order the draft and target graphs replay in.
    """

    def warmup(self, step: Callable[[], Any]) -> Any:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            result = step()
        torch.cuda.current_stream().wait_stream(side)
        return result

    def capture(self, step: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                output = step()
        except RuntimeError as error:
            raise RuntimeError(
                f"CUDA graph capture failed ({error}); run this model without graphs: "
                "backend=CUDABackend(BackendOptions(graphs=False)) or cache_layout='dynamic'"
            ) from error
        return graph, output


class CUDABackend(Backend):
    name = "cuda"
    priority = 10

    def __init__(self, options: BackendOptions | None = None) -> None:
        super().__init__(options)
        # model -> role -> what prepare returned (a model used as its own draft gets one wrapper per role)
        self._prepared: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, torch.nn.Module]] = (
            weakref.WeakKeyDictionary()
        )
        self._chosen: dict[str, str] = {}

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available()

    @classmethod
    def unavailable_reason(cls) -> str:
        if torch.version.cuda is None:
            return f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build of torch"
        return "torch.cuda.is_available() is False: no NVIDIA GPU is visible; check the driver and CUDA_VISIBLE_DEVICES"

    @property
    def device(self) -> torch.device:
        return torch.device("cuda")

    @property
    def graphs_enabled(self) -> bool:
        return self.options.graphs is not False

    def bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported()

    def graph_runtime(self) -> GraphRuntime:
        return CUDAGraphRuntime()

    def dtype_for(self, model: torch.nn.Module, role: ModelRole) -> torch.dtype:
        """Target: `options.dtype`; draft: `options.draft_precision`, else the target's choice."""
        model_dtype = next(model.parameters()).dtype
        if role == "draft" and self.options.draft_precision is not None:
            return choose_dtype(self.options.draft_precision, model_dtype, self.bf16_supported(), "draft_precision")
        return choose_dtype(self.options.dtype, model_dtype, self.bf16_supported(), "dtype")

    def cache_layout(self) -> str:
        return "static"

    def cache_layout_for(self, *models: torch.nn.Module | None) -> str:
        """Static when every model's step can be captured, else dynamic (the fallback)."""
        capturable = all(graph_capturable(_unwrapped(model)) for model in models if model is not None)
        return "static" if capturable else "dynamic"

    def prepare(self, model: torch.nn.Module, role: ModelRole) -> torch.nn.Module:
        """Cast and move `model`, wrap it for graph capture; idempotent (the same wrapper every call)."""
        if isinstance(model, GraphedCausalLM):
            return model
        if role in self._prepared.get(model, {}):
            return self._prepared[model][role]
        dtype = self.dtype_for(model, role)
        if self._prepared.get(model) and next(model.parameters()).dtype != dtype:
            raise ValueError(
                f"the {role} is the same model object as an already prepared one, so it cannot be cast to {dtype}; "
                "give draft_precision the same value as dtype, or pass a separate copy of the model"
            )
        model = model.to(device=self.device, dtype=dtype).eval()
        self._chosen[f"{role}_dtype"] = str(dtype).removeprefix("torch.")
        prepared: torch.nn.Module = model
        if self.graphs_enabled and graph_capturable(model):
            prepared = GraphedCausalLM(model, role, self.graph_runtime(), MAX_GRAPH_TOKENS)
        self._chosen[f"{role}_graphs"] = "cuda graphs" if prepared is not model else "eager"
        self._prepared.setdefault(model, {})[role] = prepared
        return prepared

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def generator(self, seed: int | None) -> torch.Generator | None:
        if seed is not None:
            torch.cuda.manual_seed_all(seed)
        return super().generator(seed)

    def memory_stats(self) -> dict[str, int]:
        return {
            "allocated_bytes": torch.cuda.memory_allocated(self.device),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(self.device),
            "reserved_bytes": torch.cuda.memory_reserved(self.device),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(self.device),
        }

    def describe(self) -> dict[str, str]:
        facts = {"backend": self.name, "device": str(self.device), "cache_layout": self.cache_layout()}
        if self.device.type == "cuda" and self.is_available():
            major, minor = torch.cuda.get_device_capability(self.device)
            facts["gpu"] = torch.cuda.get_device_name(self.device)
            facts["compute_capability"] = f"{major}.{minor}"
            facts["bf16_supported"] = str(self.bf16_supported())
        facts["torch_cuda"] = str(torch.version.cuda)
        facts["graphs"] = "on" if self.graphs_enabled else "off"
        # the keys every backend reports (the CLI's one-line summary reads them)
        facts["dtype"] = self._chosen.get("target_dtype", "model")
        facts["draft_precision"] = self._chosen.get("draft_dtype", "model")
        return facts | self._chosen


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return unprepared(model)

"""The Backend protocol: the questions the core asks a device family.

A backend never runs the loop. It says where tensors live, which dtype and KV-cache layout to use,
how to pad, and what to do at step boundaries; vendor libraries are imported inside its methods only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

import torch

from assisted_backends.options.errors import OptionError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # --dtype names, every backend


def dtype_name(dtype: torch.dtype | None) -> str:
    """`DTYPES`' name of `dtype` ("fp32", ...), else its torch name."""
    return next((name for name, known in DTYPES.items() if known == dtype), str(dtype))


def named_dtype(name: str, argument: str, device: str) -> torch.dtype:
    """DTYPES[name], or a ValueError naming `argument`, the device and the choices."""
    if name not in DTYPES:
        raise OptionError(f"{{name}} is not supported on {device}; choose one of: auto, {', '.join(DTYPES)}",
                          name=(argument, name))  # fmt: skip
    return DTYPES[name]


ModelRole = Literal["target", "draft"]


@dataclass(frozen=True)
class PaddingPolicy:
    """Shape policy for a generation.

    bucket: static caches are preallocated to a multiple of this many positions.
    static_shapes: prompts are left-padded to a multiple of `bucket` (one prefill graph per bucket), the
    batch is rounded up to a power of two, the draft always proposes exactly γ tokens and verification
    always sees γ + 1.
    """

    bucket: int = 128
    static_shapes: bool = False


@dataclass(frozen=True)
class BackendOptions:
    """What the user asked of the device; None means "the backend decides".

    dtype: target precision ("fp32", "bf16", "fp16").
    draft_precision: draft precision ("fp32", "bf16", "w8af32").
    bucket_size: static-shape bucket (prompt padding and cache preallocation granularity).
    graphs: capture graphs (HPU graphs, CUDA graphs) where the device supports it.
    """

    dtype: str | None = None
    draft_precision: str | None = None
    bucket_size: int | None = None
    graphs: bool | None = None


class Backend(ABC):
    """One device family. Subclasses are registered under the `assisted_backends.backends` entry-point group.

    `prepare` must be idempotent: the CLI prepares models once and then calls `generate` many times.
    """

    name: str  # the device name users pass: "cpu", "cuda", "hpu", ...
    priority: int = 0  # higher wins in device="auto"
    # Greedy verification may compute the target's head position by position (`engine.head_on_demand`): each
    # extra head call follows a host read of the acceptance, free on a CPU; shapes then vary with it.
    head_on_demand: bool = False

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Whether this backend can run here; no side effects beyond (lazy) imports."""

    @classmethod
    def unavailable_reason(cls) -> str:
        """One line telling the user what is missing and how to fix it."""
        return f"the {cls.name} backend is not available on this machine"

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @abstractmethod
    def prepare(self, model: torch.nn.Module, role: ModelRole) -> torch.nn.Module:
        """Move the model to the device, choose its dtype, wrap it for graph mode; return the model to call."""

    def cache_layout(self) -> str:
        """'dynamic' or 'static': the layout this device runs fastest with."""
        return "dynamic"

    def cache_layout_for(self, *models: torch.nn.Module | None) -> str:
        """The layout for these models (target, draft): `cache_layout()` unless one of them cannot use it."""
        return self.cache_layout()

    def padding(self, static_shapes: bool) -> PaddingPolicy:
        """The shape policy; `static_shapes=True` asks for the fixed-shape policy the HPU uses."""
        bucket = self.options.bucket_size or 128
        if static_shapes:
            return PaddingPolicy(bucket=bucket, static_shapes=True)
        return PaddingPolicy(bucket=bucket)

    def step_boundary(self) -> None:
        """Called after every forward pass; lazy-mode devices flush their graph here."""

    def synchronize(self) -> None:
        """Wait for queued device work (so timings are honest)."""

    def generator(self, seed: int | None) -> torch.Generator | None:
        """A seeded random generator on the device, or None to use the global RNG."""
        if seed is None:
            return None
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        return generator

    def memory_stats(self) -> dict[str, int]:
        """Device memory figures in bytes (empty when the device reports none)."""
        return {}

    def describe(self) -> dict[str, str]:
        """What was chosen and why, for the CLI to print; every backend adds at least `dtype` (the
        target's precision) and `draft_precision`."""
        return {"backend": self.name, "device": str(self.device)}


def unprepared(model: Any) -> Any:
    """The model a backend's `prepare` wrapped (`model` itself when it is no wrapper): a wrapper (CUDA
    graphs) names it `prepared_from`. Generation options are resolved on this model, and `prepare`
    is idempotent, so a caller may pass either."""
    return getattr(model, "prepared_from", model)

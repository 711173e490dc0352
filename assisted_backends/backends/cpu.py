"""CPU reference backend: fp32, dynamic KV cache, no vendor library.

It runs every code path of the core (both cache layouts, static shapes) so CI proves them without
accelerators.
"""

from __future__ import annotations

import resource
import sys

import torch

from assisted_backends.backends.base import Backend, ModelRole


class CPUBackend(Backend):
    name = "cpu"
    priority = 0

    @classmethod
    def is_available(cls) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def prepare(self, model: torch.nn.Module, role: ModelRole) -> torch.nn.Module:
        return model.to(self.device).eval()

    def memory_stats(self) -> dict[str, int]:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scale = 1 if sys.platform == "darwin" else 1024  # Linux reports KiB
        return {"peak_rss_bytes": int(peak * scale)}

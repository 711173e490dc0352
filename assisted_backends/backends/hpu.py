"""hpu backend: placeholder until its issue lands (never usable, says so)."""

from __future__ import annotations

import torch

from assisted_backends.backends.base import Backend


class HPUBackend(Backend):
    name = "hpu"
    priority = 10

    @classmethod
    def is_available(cls) -> bool:
        return False

    @classmethod
    def unavailable_reason(cls) -> str:
        return "the hpu backend is not implemented yet"

    @property
    def device(self) -> torch.device:
        return torch.device("hpu")

    def prepare(self, model, role):
        raise NotImplementedError(self.unavailable_reason())

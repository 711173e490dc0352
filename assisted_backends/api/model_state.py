"""The caller's models leave a `generate` call in the training mode they entered it with.

Backends prepare a model once (`Backend.prepare` is idempotent and may return early), so the loop
puts the prepared models in eval mode on every call, and `restored` gives every submodule of the
caller's models its own `training` flag back afterwards. dtype and device: a backend keeps the
model's dtype unless a `dtype` was asked for (then the target is cast in place, as `model.to` does);
CUDA and HPU move the target to their device in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def restored(*models: torch.nn.Module | None) -> Iterator[None]:
    """Record each submodule's `training` flag on entry; put them back on exit (also after an error)."""
    saved = [(module, module.training) for model in models if model is not None for module in model.modules()]
    try:
        yield
    finally:
        for module, training in saved:
            module.training = training
        for model in models:  # a submodule a backend put in place (IPEX's in-place rewrite) takes its parent's flag
            if model is not None:
                _inherit_training(model, {id(module) for module, _ in saved})


def _inherit_training(module: torch.nn.Module, known: set[int]) -> None:
    for child in module.children():
        if id(child) not in known:
            child.train(module.training)
        else:
            _inherit_training(child, known)


def evaluation_mode(*models: torch.nn.Module | None) -> None:
    """Dropout and friends off for the call: `model.eval()` on each model given."""
    for model in models:
        if model is not None:
            model.eval()

"""Everything that differs between transformers 4.51 and 5.x, in one place.

The rest of the package talks to Hugging Face models only through these helpers, so a new
transformers release is handled here and nowhere else.
"""

from __future__ import annotations

import inspect
from functools import cache

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache


@cache
def _forward_parameters(model_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)


def forward_accepts(model: torch.nn.Module, name: str) -> bool:
    """Whether `model.forward` names `name` explicitly (not only through **kwargs)."""
    return name in _forward_parameters(type(model))


def logits_to_keep_kwargs(model: torch.nn.Module, keep: int) -> dict[str, int]:
    """Ask for the last `keep` positions' logits only (`logits_to_keep` in 5.x, `num_logits_to_keep` in 4.4x)."""
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if forward_accepts(model, name):
            return {name: keep}
    return {}


def new_dynamic_cache(model: PreTrainedModel) -> DynamicCache:
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers < 4.56 takes no config
        return DynamicCache()


def new_static_cache(
    model: PreTrainedModel, batch_size: int, max_cache_len: int, dtype: torch.dtype, device: torch.device
) -> StaticCache:
    """A cache preallocated to `max_cache_len` positions (lazily on first write in 5.x)."""
    config = model.config
    try:  # transformers 4.5x signature
        return StaticCache(
            config=config, max_batch_size=batch_size, max_cache_len=max_cache_len, device=device, dtype=dtype
        )
    except TypeError:
        return StaticCache(config=config, max_cache_len=max_cache_len)


def crop_dynamic_cache(cache: DynamicCache, length: int) -> None:
    """Drop every cached position at index >= `length` (a negative argument means 'remove' in 4.5x and 5.x)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def set_static_cache_length(cache: StaticCache, length: int) -> None:
    """Move the write position of a static cache to `length`; nothing is copied or cleared.

    transformers 5.x keeps the write position in each layer's `cumulative_length`; 4.5x writes at the
    `cache_position` the caller passes, so there is nothing to move.
    """
    for layer in getattr(cache, "layers", ()):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor):
            counter.fill_(length)
        elif counter is not None:
            layer.cumulative_length = length


def max_positions(model: PreTrainedModel) -> int | None:
    """The longest sequence the model's position encoding supports, when the config states one."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None

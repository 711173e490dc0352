"""Everything that differs between transformers 4.51 and 5.x, in one place.

The rest of the package talks to Hugging Face models only through these helpers, so a new
transformers release is handled here and nowhere else.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from functools import cache

import torch
import transformers
from transformers import DynamicCache, PreTrainedModel, StaticCache

_TRANSFORMERS_VERSION = tuple(int(part) for part in transformers.__version__.split(".")[:2])


@cache
def _forward_parameters(model_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)


def forward_accepts(model: torch.nn.Module, name: str) -> bool:
    """Whether `model.forward` names `name` explicitly (not only through **kwargs)."""
    return name in _forward_parameters(type(model))


def cache_argument(model: torch.nn.Module) -> str | None:
    """The forward argument a model takes its KV cache under: `cache` from transformers 5.24 on,
    `past_key_values` before (5.24 still accepts it, with a deprecation warning, until 5.40); None if neither."""
    for name in ("cache", "past_key_values"):
        if forward_accepts(model, name):
            return name
    return None


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """{argument: cache} for `model.forward` (see `cache_argument`)."""
    return {cache_argument(model) or "past_key_values": cache}


def logits_to_keep_kwargs(model: torch.nn.Module, keep: int) -> dict[str, int]:
    """Ask for the last `keep` positions' logits only (`logits_to_keep` in 5.x, `num_logits_to_keep` in 4.4x)."""
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if forward_accepts(model, name):
            return {name: keep}
    return {}


class LegacyCache:
    """The KV cache of a model that still takes `past_key_values` as tuples and returns new ones.

    In transformers < 4.53, GPT-2 and GPTBigCode accept no Cache object: each forward reads the tuple
    it is given and returns a longer one. The runner hands the model `model_inputs(...)` and stores
    what comes back with `keep_returned_cache`; rollback slices every tensor on its sequence axis (-2
    for GPT-2's [B, H, T, D] keys and values and for GPTBigCode's fused [B, (H,) T, 2D] ones).
    """

    def __init__(self) -> None:
        self.layers: tuple | None = None

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if not self.layers:
            return 0
        first = self.layers[layer_idx]
        return (first[0] if isinstance(first, (tuple, list)) else first).shape[-2]

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (a negative `length` removes that many, as DynamicCache.crop)."""
        if length < 0:
            length = self.get_seq_length() + length
        if not self.layers:
            return

        def cut(item):
            if isinstance(item, (tuple, list)):
                return type(item)(cut(part) for part in item)
            return item[..., :length, :]

        self.layers = tuple(cut(layer) for layer in self.layers)


def uses_legacy_cache(model: PreTrainedModel) -> bool:
    """True for models that take tuple caches only (`_supports_cache_class = False`, transformers < 4.53)."""
    return getattr(model, "_supports_cache_class", True) is False


def model_inputs(cache, attention_mask: torch.Tensor | None, query_length: int) -> tuple:
    """(past_key_values, attention_mask) for one forward on top of `cache`.

    A LegacyCache is passed as its tuple (None while empty), and a mask the layout sized for a
    preallocated cache is cut to the positions the tuple really holds plus the new ones.
    """
    if not isinstance(cache, LegacyCache):
        return cache, attention_mask
    if attention_mask is not None:
        attention_mask = attention_mask[:, : cache.get_seq_length() + query_length]
    return cache.layers, attention_mask


def keep_returned_cache(cache, output) -> None:
    """Store the tuple cache a legacy model returned (a no-op for Cache objects, updated in place)."""
    if isinstance(cache, LegacyCache):
        cache.layers = tuple(returned_cache(output))


def returned_cache(output):
    """The cache a forward returned: `output.cache` from transformers 5.24 on, `output.past_key_values` before."""
    for name in ("cache", "past_key_values"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None


# The position id `model.generate` gives masked columns when it derives positions from the mask.
MASKED_POSITION_ID = 0 if _TRANSFORMERS_VERSION >= (5, 0) else 1


def activation_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a model's hidden states have: its first floating-point parameter's; fp32 when it has none left
    (every weight quantized into buffers, parameter-free norms)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's weights live (its first parameter or buffer)."""
    return next((t.device for t in [*model.parameters(), *model.buffers()]), torch.device("cpu"))


def dtype_kwargs(dtype: torch.dtype | None) -> dict[str, torch.dtype]:
    """The keyword `from_pretrained` takes a dtype under: `dtype` from transformers 4.56, `torch_dtype` before."""
    if dtype is None:
        return {}
    return {"dtype": dtype} if _TRANSFORMERS_VERSION >= (4, 56) else {"torch_dtype": dtype}


ROLLBACK_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
# From this release on, hybrid models (Gemma 2/3, Cohere 2) take their window from the config and apply it
# to absolute positions whatever cache they are given; before it they need a HybridCache.
HYBRID_MASKS_FROM_CONFIG = (4, 55)  # 4.51 needs a HybridCache; 4.55 and 5.x are tested
CHUNKED_MASKS_FROM_CONFIG = (5, 0)  # chunked attention (Llama 4): 4.55 gives wrong tokens on a full cache


def text_config_of(config):
    """The decoder's part of a model config (the config itself for a text-only causal LM)."""
    if hasattr(config, "get_text_config"):
        try:
            return config.get_text_config(decoder=True)
        except TypeError:  # transformers < 4.52 takes no `decoder`
            return config.get_text_config()
    return config


def text_config(model: PreTrainedModel):
    """The decoder's config of `model`."""
    return text_config_of(model.config)


def rollback_refusal(model: PreTrainedModel) -> str | None:
    """Why the model's cache cannot move back to an earlier position exactly (the end of a sentence that
    begins "the target (Name) ..."), or None when it can.

    Attention layers of every kind (full, sliding-window, chunked) roll back: the caches this module
    builds keep every position (see `full_storage_config`). Recurrent and linear-attention state
    (Mamba, RWKV, hybrid SSM stacks) and cross-layer KV sharing fold the past into a state that a
    rejected draft token cannot be taken out of.
    """
    if getattr(model, "_is_stateful", False):
        return (
            "keeps recurrent state that cannot be rolled back past a rejected draft token; assisted decoding "
            "needs an attention-only model"
        )
    if cache_argument(model) is None:
        return (
            "keeps no KV cache (its forward takes neither cache nor past_key_values); assisted decoding needs a "
            "model that caches keys and values"
        )
    config = text_config(model)
    unsupported = sorted(set(getattr(config, "layer_types", None) or ()) - set(ROLLBACK_LAYER_TYPES))
    if unsupported:
        return (
            f"has layers of type {unsupported} whose cache cannot be rolled back exactly; supported layer types: "
            f"{list(ROLLBACK_LAYER_TYPES)}"
        )
    chunked = getattr(config, "attention_chunk_size", None) is not None
    hybrid = getattr(config, "cache_implementation", None) == "hybrid"
    for needed, applies in ((CHUNKED_MASKS_FROM_CONFIG, chunked), (HYBRID_MASKS_FROM_CONFIG, hybrid)):
        if applies and _TRANSFORMERS_VERSION < needed:
            return (
                f"mixes windowed (sliding or chunked) and full-attention layers, whose masks transformers "
                f"{transformers.__version__} cannot build on a cache that rolls back. "
                f"Upgrade: pip install 'transformers>={needed[0]}.{needed[1]}'"
            )
    if getattr(config, "kv_sharing_modes", None) or getattr(config, "num_kv_shared_layers", 0):
        return "shares KV caches across layers, which this package cannot roll back; use a model without KV sharing"
    return None


def full_storage_config(model: PreTrainedModel):
    """A copy of the decoder config whose every layer is a full-attention cache layer.

    Used only to build caches. Sliding-window and chunked layers then keep every position instead of
    the last W: a rollback never needs a position the window already dropped, and the model still
    attends only within its window, because the masks come from the model's own config (its
    window applies to absolute positions) and not from the cache's layer kinds. The price is memory
    and attention work over positions older than W, for sequences longer than the window.
    """
    config = text_config(model)
    if not (getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)):
        return config
    config = copy.deepcopy(config)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = ["full_attention"] * len(config.layer_types)
    for name in ("sliding_window", "attention_chunk_size"):
        if hasattr(config, name):
            setattr(config, name, None)
    return config


def _own_cache(model: torch.nn.Module, batch: int | None = None, capacity: int = 0):
    """The cache a model makes for itself (`new_native_cache`: the native decoder's), or None."""
    factory = getattr(model, "new_native_cache", None)
    return factory(batch, capacity) if callable(factory) else None


def new_dynamic_cache(model: PreTrainedModel) -> DynamicCache | LegacyCache:
    """An append-only cache, every layer keeping every position (`full_storage_config`)."""
    own = _own_cache(model)
    if own is not None:
        return own
    if uses_legacy_cache(model):
        return LegacyCache()
    if _TRANSFORMERS_VERSION < (4, 56):  # no config argument (4.51), or one some configs fail to parse (4.55)
        return DynamicCache()  # every layer full-length there anyway
    return DynamicCache(config=full_storage_config(model))


def new_static_cache(
    model: PreTrainedModel, batch_size: int, max_cache_len: int, dtype: torch.dtype, device: torch.device
) -> StaticCache | LegacyCache:
    """A cache preallocated to `max_cache_len` positions in every layer (lazily on first write in 5.x).

    Sliding-window layers get full-length storage too (`full_storage_config`): a static sliding layer
    writes cyclically, so moving its write position back would not undo a rejected token.
    Models with tuple caches only (GPT-2, GPTBigCode in transformers < 4.53) have no static cache: they
    get a LegacyCache, so the static layout still runs them (rollback slices instead of moving a
    position; the shapes are not fixed, which only graph-capturing devices need).
    """
    own = _own_cache(model, batch_size, max_cache_len)
    if own is not None:
        return own
    if uses_legacy_cache(model):
        return LegacyCache()
    config = full_storage_config(model)
    try:  # transformers 4.5x signature
        return StaticCache(
            config=config, max_batch_size=batch_size, max_cache_len=max_cache_len, device=device, dtype=dtype
        )
    except TypeError:
        return StaticCache(config=config, max_cache_len=max_cache_len)


def crop_dynamic_cache(cache: DynamicCache | LegacyCache, length: int) -> None:
    """Drop every cached position at index >= `length` (a negative argument means 'remove' in 4.5x and 5.x)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def set_static_cache_length(cache: StaticCache, length: int) -> None:
    """Move the write position of a static cache to `length`; nothing is copied or cleared.

    transformers 5.x keeps the write position in each layer's `cumulative_length`; 4.5x writes at the
    `cache_position` the caller passes, so there is nothing to move. A LegacyCache is cut to `length`.
    """
    if isinstance(cache, LegacyCache):
        cache.crop(length)
        return
    for layer in getattr(cache, "layers", ()):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor):
            with torch.inference_mode():  # the counter was made inside the model's inference-mode forward
                counter.fill_(length)
        elif counter is not None:
            layer.cumulative_length = length


def is_tuple_cache(cache) -> bool:
    """Whether `cache` is a `LegacyCache`: tuples a forward replaces, never tensors written in place."""
    return isinstance(cache, LegacyCache)


def map_cache_tensors(cache, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace every cache tensor holding positions on axis -2 (keys and values, or GPTBigCode's fused tensor of a
    tuple cache) by `change(tensor)`, whichever way this transformers version stores them."""

    def changed(tensor):
        if tensor is None or not isinstance(tensor, torch.Tensor) or tensor.dim() < 3:
            return tensor
        return change(tensor)

    if isinstance(cache, LegacyCache):
        if cache.layers:
            cache.layers = tuple(
                type(layer)(changed(part) for part in layer) if isinstance(layer, (tuple, list)) else changed(layer)
                for layer in cache.layers
            )
        return
    layers = getattr(cache, "layers", None)
    if layers and hasattr(layers[0], "keys"):  # transformers >= 4.54: one object per layer
        for layer in layers:
            layer.keys, layer.values = changed(layer.keys), changed(layer.values)
        return
    for name in ("key_cache", "value_cache"):  # transformers 4.5x: two lists
        tensors = getattr(cache, name, None)
        if tensors is not None:
            tensors[:] = [changed(tensor) for tensor in tensors]


def cache_tensors(cache) -> list[list[torch.Tensor]]:
    """Per layer, the cache tensors holding positions on axis -2 (keys and values, or GPTBigCode's fused
    [B, (H,) T, 2D] tensor of a tuple cache); layers not written yet are left out."""

    def tensors(items) -> list[torch.Tensor]:
        return [t for t in items if isinstance(t, torch.Tensor) and t.dim() >= 3]

    if isinstance(cache, LegacyCache):
        return [tensors(layer if isinstance(layer, (tuple, list)) else (layer,)) for layer in (cache.layers or ())]
    layers = getattr(cache, "layers", None)
    if layers and hasattr(layers[0], "keys"):  # transformers >= 4.54: one object per layer
        return [tensors((layer.keys, layer.values)) for layer in layers]
    keys, values = getattr(cache, "key_cache", None) or [], getattr(cache, "value_cache", None) or []
    return [tensors(pair) for pair in zip(keys, values)]  # transformers 4.5x: two lists


def layer_keys_values(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) [B, H, T, D] of one layer of a Cache object."""
    layers = getattr(cache, "layers", None)
    if layers and hasattr(layers[0], "keys"):  # transformers >= 4.54: one object per layer
        return layers[layer].keys, layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]  # transformers 4.5x: two lists

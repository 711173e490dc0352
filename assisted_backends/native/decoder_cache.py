"""`NativeCache`: the native decoder's KV cache, per layer [B, Hkv, C, Dh] fp32 (or half: `KV_CACHE_DTYPES`), and its
layer views.

The engine's layouts crop it, roll it back and move its rows (`engine.cache_surgery`) through `layers`, as they do
a transformers cache; the native step (`native.decoder_model`) writes each forward's rows into its buffers.
"""

from __future__ import annotations

import torch

_GROWTH = 64  # the fewest positions a dynamic cache holds; it doubles from there (memory follows the length used)
#: the cache's storage by name: fp32 (the default), or keys and values rounded to a half type when stored (half the
#: bytes each step's attention reads; the attention converts them back to fp32 exactly)
KV_CACHE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def kv_cache_dtype(name: str) -> torch.dtype:
    """The storage type `name` (a key of `KV_CACHE_DTYPES`) names; one ValueError otherwise."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={name!r} is not one of {', '.join(map(repr, KV_CACHE_DTYPES))}")
    return KV_CACHE_DTYPES[name]


class _LayerView:
    """One layer's keys and values [B, Hkv, length, Dh] as views of the cache's buffers (what `engine.cache_surgery`
    reads and writes through `hf_compat.map_cache_tensors` / `cache_tensors`); assigning one stores it."""

    def __init__(self, cache: NativeCache, index: int) -> None:
        self._cache, self._index = cache, index

    @property
    def keys(self) -> torch.Tensor | None:
        return self._cache.view(self._cache.keys, self._index)

    @keys.setter
    def keys(self, value: torch.Tensor) -> None:
        self._cache.store(self._cache.keys, self._index, value)

    @property
    def values(self) -> torch.Tensor | None:
        return self._cache.view(self._cache.values, self._index)

    @values.setter
    def values(self, value: torch.Tensor) -> None:
        self._cache.store(self._cache.values, self._index, value)


class NativeCache:
    """The native decoder's KV cache: per layer [B, Hkv, C, Dh] fp32, preallocated; `length` positions valid.

    Rollback is setting `length` (`crop`); a forward writes its rows at the positions the engine names
    (`cache_position`) and the stale tail past them is never read. Grows by reallocation (a dynamic layout) when a
    forward needs more than C positions; a static layout's capacity is fixed when made."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, batch: int | None = None, capacity: int = 0,
                 dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, dtype
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self._length = 0
        self._stored: dict[tuple[int, int], int] = {}  # (buffer kind, layer) -> width, while a row move is under way
        self._views = [_LayerView(self, index) for index in range(layers)]
        self.static_capacity = capacity if batch is not None else None
        if batch is not None:
            self._allocate(batch, max(capacity, 1))

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        self._length = value
        self._stored.clear()

    @property
    def layers(self) -> list:
        """Per layer, its keys and values (`engine.cache_surgery` moves rows through them)."""
        return self._views

    @property
    def batch(self) -> int | None:
        return None if self.keys[0] is None else self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def _allocate(self, batch: int, capacity: int) -> None:
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        for buffers in (self.keys, self.values):
            for index, old in enumerate(buffers):
                new = torch.zeros(shape, dtype=self.dtype)
                if old is not None and old.shape[0] == batch:
                    keep = min(old.shape[2], capacity)
                    new[:, :, :keep] = old[:, :, :keep]
                buffers[index] = new

    def reserve(self, batch: int, end: int) -> None:
        """Room for positions [0, end) of `batch` rows (a different batch size starts empty)."""
        if self.batch != batch:
            self._allocate(batch, max(end, _GROWTH))
            self.length = 0
        elif end > self.capacity:
            self._allocate(batch, max(end, 2 * self.capacity))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions (negative: drop that many), as DynamicCache.crop."""
        keep = self.length + max_length if max_length < 0 else max_length
        self.length = max(0, min(self.length, keep))

    def view(self, buffers: list, index: int) -> torch.Tensor | None:
        tensor = buffers[index]
        width = self._stored.get((buffers is self.values, index), self._length)
        return None if tensor is None else tensor[:, :, :width]

    def store(self, buffers: list, index: int, value: torch.Tensor) -> None:
        """A layer's new keys or values [B', Hkv, T, Dh] (rows moved or left): copied into the buffers, which
        are reallocated where B' or T does not fit. `length` becomes T once every layer's keys and values are stored
        (a row move replaces them one tensor at a time, each read at the old length before its turn)."""
        batch, _, width, _ = value.shape
        tensor = buffers[index]
        if tensor is None or tensor.shape[0] != batch or tensor.shape[2] < width:
            tensor = torch.zeros(batch, self.kv_heads, max(width, self.capacity, 1), self.head_dim, dtype=self.dtype)
            buffers[index] = tensor
        with torch.inference_mode():
            if value.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr():
                value = value.clone()  # a row move's view of these very buffers: an overlapping copy would smear it
            tensor[:, :, :width].copy_(value)
        self._stored[(buffers is self.values, index)] = width
        if len(self._stored) == 2 * len(self.keys):
            self.length = width

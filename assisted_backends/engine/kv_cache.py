"""KV-cache layouts: where one model's keys and values live and how a rejected tail is undone.

Both layouts keep the invariant of docs/design.md rule 5: after every round the cache holds exactly the
committed tokens that the model has been fed (`length` positions, left padding included).

- `DynamicLayout`: the cache grows by concatenation; rollback crops it.
- `StaticLayout`: preallocated to `capacity` positions (a bucket multiple); rollback only moves the
  write position. Entries past the position are stale: the causal mask hides them and the next write
  overwrites them. The attention mask always spans `capacity`, so every step sees fixed shapes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from transformers import PreTrainedModel

from assisted_backends import hf_compat
from assisted_backends.engine.cache_surgery import move_cache_rows, write_cache_row
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.slots import RowPadding


class CacheLayout(ABC):
    """One model's KV cache plus the bookkeeping the runner needs to call the model.

    `padding`: each row's left padding (masked out). Given the slots' `RowPadding`, the layout reads the
    slots' own (held once: moving the slots' rows moves it); given a tensor [B], the layout holds its own.
    """

    name: str

    def __init__(self, pad: torch.Tensor | RowPadding) -> None:
        self.padding = RowPadding.of(pad)
        self.length = 0  # positions written and valid, padding included

    @property
    def pad(self) -> torch.Tensor:
        """[B] left-padding positions per row, on the device."""
        return self.padding.tensor

    @property
    @abstractmethod
    def cache(self): ...

    @abstractmethod
    def attention_mask(self, query_length: int) -> torch.Tensor | None:
        """The 2-D mask for a forward of `query_length` new positions, or None when nothing is masked."""

    def advance(self, query_length: int) -> None:
        self.length += query_length

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Forget every position at index >= `length`."""

    def move_rows(self, move: RowMove, length: int) -> None:
        """Batches (`engine.realign`): move every row's cached positions by its shift and keep at most `length`
        (fewer when a row moved left past what was written); the rows' new padding is the slots', moved first."""
        keep = max(0, min(length, self.length + min(move.shifts))) if self.length > 0 else 0  # empty stays empty
        if self.length > 0:
            move_cache_rows(self.cache, move, self.length, keep, in_place=self._in_place)
        self.length = keep

    def set_row_pad(self, slot: int, pad: int) -> None:
        """Queues (`engine.joins`): the row at `slot` has a new occupant behind `pad` columns of padding
        (already so when the padding is the slots', which placed the row)."""
        self.padding.set_row(slot, pad)

    def write_row(
        self,
        slot: int,
        source: CacheLayout,
        begin: int,
        source_begin: int,
        count: int,
        layers: int | None = None,
        source_row: int = 0,
    ) -> None:
        """Queues: positions [source_begin, source_begin + count) of `source`'s row `source_row` (row 0 of a one-row
        pass over a joining prompt) become positions [begin, begin + count) of the row at `slot`; the
        first `layers` layers only when given (an early-exit view reading the target's cache)."""
        write_cache_row(self.cache, source.cache, slot, source_row, begin, source_begin, count, layers)

    @abstractmethod
    def one_row(self, model: PreTrainedModel, pad: int, width: int) -> CacheLayout:
        """An empty layout of this kind for one row of `width` columns, `pad` of them left padding: where a
        joining prompt's own pass runs before its keys and values are written into this batch's cache."""

    def _padding_mask(self, total: int) -> torch.Tensor:
        positions = torch.arange(total, device=self.pad.device)
        return (positions[None, :] >= self.pad[:, None]).long()  # [B, total]


class DynamicLayout(CacheLayout):
    name = "dynamic"
    _in_place = False

    def __init__(self, model: PreTrainedModel, pad: torch.Tensor | RowPadding) -> None:
        super().__init__(pad)
        self._cache = hf_compat.new_dynamic_cache(model)

    @property
    def cache(self):
        return self._cache

    def attention_mask(self, query_length: int) -> torch.Tensor | None:
        if not self.padding.any():
            return None  # no padding: the model's own causal mask is exact and cheapest
        return self._padding_mask(self.length + query_length)

    def rollback(self, length: int) -> None:
        if length < self.length:
            hf_compat.crop_dynamic_cache(self._cache, length)
            self.length = length

    def one_row(self, model: PreTrainedModel, pad: int, width: int) -> DynamicLayout:
        return DynamicLayout(model, torch.tensor([pad], device=self.pad.device))


class StaticLayout(CacheLayout):
    name = "static"
    _in_place = True  # graphs captured the cache's addresses

    def __init__(self, model: PreTrainedModel, pad: torch.Tensor | RowPadding, capacity: int) -> None:
        super().__init__(pad)
        self.capacity = capacity
        self._cache = hf_compat.new_static_cache(
            model,
            batch_size=len(self.padding.host),
            max_cache_len=capacity,
            dtype=hf_compat.activation_dtype(model),
            device=hf_compat.model_device(model),
        )
        self._mask, self._mask_of = self._padding_mask(capacity), self._padding_key()  # [B, capacity]

    @property
    def cache(self):
        return self._cache

    def attention_mask(self, query_length: int) -> torch.Tensor:
        if self.length + query_length > self.capacity:
            raise RuntimeError(
                f"static KV cache overflow: {self.length} + {query_length} positions > capacity {self.capacity}"
            )
        if self._mask_of != self._padding_key():  # rows moved or joined: the mask follows their padding
            self._mask, self._mask_of = self._padding_mask(self.capacity), self._padding_key()
        return self._mask

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.length = length
            hf_compat.set_static_cache_length(self._cache, length)

    def move_rows(self, move: RowMove, length: int) -> None:
        if move.keep is not None:
            raise RuntimeError("a static cache keeps its batch size: finished rows ride along, they never leave")
        super().move_rows(move, length)
        hf_compat.set_static_cache_length(self._cache, self.length)

    def _padding_key(self) -> tuple[int, int]:
        return id(self.padding), self.padding.version

    def one_row(self, model: PreTrainedModel, pad: int, width: int) -> StaticLayout:
        """A fresh scratch layout of `width` columns (a prompt bucket): [1, width] fed on an empty [1, width] cache
        is one more signature per prompt bucket, the same every time (a reused cache, allocated after its first
        pass, would give each bucket two)."""
        return StaticLayout(model, torch.tensor([pad], device=self.pad.device), width)


def bucketed(length: int, bucket: int) -> int:
    """Smallest multiple of `bucket` that is >= `length`."""
    return -(-length // bucket) * bucket


def make_layout(
    name: str, model: PreTrainedModel, pad: torch.Tensor | RowPadding, capacity: int, bucket: int
) -> CacheLayout:
    """Layout `name` ("dynamic" or "static"); a static one is preallocated to `capacity` rounded up to `bucket`.
    `pad`: the slots' `RowPadding` (shared), or a tensor [B] (a padding of the layout's own)."""
    if name == "static":
        return StaticLayout(model, pad, bucketed(capacity, bucket))
    return DynamicLayout(model, pad)

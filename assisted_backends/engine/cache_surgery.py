"""Row and position surgery on a model's KV cache: what batches and queues do to the cache layouts' tensors.

`engine.kv_cache`'s layouts call these when a batch's rows move (`engine.realign`), when a queue's joining prompt is
written into a slot (`engine.joins`), and when an early-exit view copies the target's first layers
(`drafters.early_exit`). How a transformers version stores the tensors is `hf_compat`'s business
(`map_cache_tensors`, `cache_tensors`); what is moved where is decided here.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from assisted_backends import hf_compat
from assisted_backends.engine.realign import RowMove


def move_cache_rows(cache, move: RowMove, written: int, width: int, in_place: bool) -> None:
    """Apply `move` to every key and value tensor of `cache` (sequence axis -2): the first `written` positions are
    moved, the first `width` of the result kept. `in_place` (static caches, whose addresses graphs captured): copied
    back into the same tensors; else each tensor is replaced (always for tuple caches, grown by concatenation)."""
    in_place = in_place and not hf_compat.is_tuple_cache(cache)

    def moved(tensor: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():  # the cache's tensors were made in inference mode
            source = tensor[..., : min(written, tensor.shape[-2]), :]
            result = move.apply(source, width=width, seq_dim=-2)
            if in_place:
                tensor[..., :width, :].copy_(result)
                return tensor
            return result

    hf_compat.map_cache_tensors(cache, moved)


def write_cache_row(
    destination,
    source,
    row: int,
    source_row: int,
    begin: int,
    source_begin: int,
    count: int,
    layers: int | None = None,
) -> None:
    """Copy positions [source_begin, source_begin + count) of row `source_row` of `source` into positions
    [begin, begin + count) of row `row` of `destination`, in place, for every layer (the first `layers` only
    when given). Both caches hold those positions already (the destination's row gets a new occupant)."""
    if count <= 0:
        return
    pairs = list(zip(hf_compat.cache_tensors(destination), hf_compat.cache_tensors(source)))[
        : layers if layers is not None else None
    ]
    with torch.inference_mode():  # the caches' tensors were made in inference mode
        for into, out_of in pairs:
            for target, given in zip(into, out_of):
                target[row, ..., begin : begin + count, :].copy_(
                    given[source_row, ..., source_begin : source_begin + count, :]
                )


def copy_cache_positions(source, destination, layers: int, begin: int, end: int) -> bool:
    """Append positions [begin, end) of the first `layers` layers of `source` to `destination` (which holds
    `begin` positions). Dynamic caches only: False for any other kind, and nothing is copied."""
    if not (isinstance(source, DynamicCache) and isinstance(destination, DynamicCache)):
        return False
    for layer in range(layers if end > begin else 0):
        keys, values = hf_compat.layer_keys_values(source, layer)
        with torch.inference_mode():  # the caches' tensors were made in inference mode
            destination.update(keys[..., begin:end, :].clone(), values[..., begin:end, :].clone(), layer)
    return True


def keep_cache_positions(cache, begin: int, positions: list[int]) -> None:
    """Token trees: the keys and values at `positions` (ascending, each >= `begin`) move to the consecutive positions
    [begin, begin + len(positions)) of every cache tensor, in place; what lies past them is left for a rollback."""
    if not positions or positions == list(range(begin, begin + len(positions))):
        return
    with torch.inference_mode():  # the caches' tensors were made in inference mode
        for layer in hf_compat.cache_tensors(cache):
            for tensor in layer:
                index = torch.tensor(positions, device=tensor.device)
                gathered = tensor.index_select(-2, index)  # a copy: overlapping moves are safe
                tensor[..., begin : begin + len(positions), :].copy_(gathered)

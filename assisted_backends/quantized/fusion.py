"""One kernel call for the projections that read the same input: q/k/v, and gate/up.

A decoder layer calls `q_proj(h)`, `k_proj(h)`, `v_proj(h)` on one tensor h. `fuse_projections` concatenates such
siblings' block weights along N into one layer (a `QuantizedLinear`) and puts a `ProjectionSlice` in each sibling's
place: the first sibling called runs the fused layer on h (one activation quantization, one pass over the weights),
the others return their columns of that result (the same tensor object h: the siblings are called one after
the other on it). Siblings whose tensors the loader placed one after the other in one buffer (`quantized.model`)
are fused as a view of it, without a copy (`joined`). Nothing changes in the
numbers: the kernel computes every output element alone (its tile neighbours do not enter it), so each column of
the fused result is, bit for bit, what the sibling's own layer computes. Siblings are read by the weight they hold
(a `BlockWeight`) and the fused layer is of their own class: this module stands below `linear`.
"""

from __future__ import annotations

import torch
from torch import nn

from assisted_backends.quantized.blocks import TILE, BlockWeight

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedProjection(nn.Module):
    """The fused layer, and its output for the input the siblings are reading now."""

    def __init__(self, fused: nn.Module, widths: list[int]) -> None:
        super().__init__()
        self.fused = fused
        self.widths = widths
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._reads = 0

    def output_for(self, x: torch.Tensor) -> torch.Tensor:
        """The fused result [..., ΣN] for x: computed by the first sibling that asks, dropped once all have read it."""
        if self._input is not x:
            self._output, self._input, self._reads = self.fused.forward(x), x, 0  # no hooks on the fused layer
        output = self._output
        self._reads += 1
        if self._reads == len(self.widths):
            self._input = self._output = None
        return output


class ProjectionSlice(nn.Module):
    """Sibling `index` of a `SharedProjection`: its columns [start, start + N) of the fused result."""

    def __init__(self, shared: SharedProjection, start: int, out_features: int) -> None:
        super().__init__()
        object.__setattr__(self, "shared", shared)  # not a submodule: the parent owns it once
        self.start, self.out_features = start, out_features
        self.in_features = shared.fused.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared.output_for(x)[..., self.start : self.start + self.out_features]

    def extra_repr(self) -> str:
        return f"columns {self.start}..{self.start + self.out_features} of a fused projection"


def _fusable(layers: list[nn.Module]) -> bool:
    weights = [getattr(layer, "weight_data", None) for layer in layers]  # a quantized layer's weight, else None
    if not all(isinstance(w, BlockWeight) for w in weights) or len({type(layer) for layer in layers}) != 1:
        return False
    first = weights[0]
    same = all(
        w.in_features == first.in_features and (w.bits, w.group, w.sb, w.offset) == (first.bits, first.group, first.sb,
        first.offset) and tuple(t is None for t in (w.dmin, w.sc, w.mn)) == tuple(t is None for t in (first.dmin,
        first.sc, first.mn)) for w in weights
    )  # fmt: skip
    biases = {layer.bias is None for layer in layers}
    return same and len(biases) == 1 and all(w.out_features % TILE == 0 for w in weights)


def adjacent(tensors: list[torch.Tensor]) -> bool:
    """Whether `tensors` (same dtype and trailing shape, each contiguous) lie one after the other in one storage, so
    that their concatenation along dim 0 is a view of it (`joined`)."""
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()
    end = first.data_ptr()
    for tensor in tensors:
        if (tensor.dtype != first.dtype or tensor.shape[1:] != first.shape[1:] or not tensor.is_contiguous()
                or tensor.untyped_storage().data_ptr() != storage or tensor.data_ptr() != end):  # fmt: skip
            return False
        end += tensor.nbytes
    return True


def joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The concatenation of `tensors` along dim 0: a view of their storage when they are `adjacent` (the loader
    places siblings so: no copy, the same bytes), else a new tensor (`torch.cat`)."""
    if not adjacent(tensors):
        return torch.cat(tensors)
    first = tensors[0]
    shape = (sum(tensor.shape[0] for tensor in tensors), *first.shape[1:])
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), shape)  # contiguous strides


def _concatenated(layers: list[nn.Module]) -> nn.Module:
    """One layer of the siblings' class over their block weights joined along N (and their biases)."""
    weights = [layer.weight_data for layer in layers]
    first = weights[0]
    join = lambda name: None if getattr(first, name) is None else joined([getattr(w, name) for w in weights])  # noqa: E731
    fused = BlockWeight(join("codes"), join("d"), join("dmin"), join("sc"), join("mn"),
                        sum(w.out_features for w in weights), first.in_features, first.bits, first.group, first.sb,
                        first.offset)  # fmt: skip
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return type(layers[0])(fused, bias)


def fuse_projections(model: nn.Module) -> int:
    """Fuse every group of `SIBLINGS` under one parent whose block weights agree in format; the count fused."""
    count = 0
    for parent in list(model.modules()):
        for names in SIBLINGS:
            layers = [getattr(parent, name, None) for name in names]
            if any(layer is None for layer in layers) or not _fusable(layers):
                continue
            shared = SharedProjection(_concatenated(layers), [layer.out_features for layer in layers])
            parent.add_module("_".join(name.removesuffix("_proj") for name in names) + "_fused", shared)
            start = 0
            for name, layer in zip(names, layers):
                setattr(parent, name, ProjectionSlice(shared, start, layer.out_features))
                start += layer.out_features
            count += 1
    return count

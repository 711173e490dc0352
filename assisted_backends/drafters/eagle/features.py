"""Reading the target's hidden states where it computes them: forward hooks on its decoder layers, or the native
decoder's own copy of them.

`LayerTap` keeps the residual stream entering three decoder layers (index k = L: the last layer's output)
during one forward, and concatenates them low, middle, high: the [B, q, 3 H_t] features of the fed
positions. On transformers' modeling, hooks on the decoder layers catch them; a target stepped by the native
decoder (`native.decoder_model.NativeCausalLM`, whose layers are one C++ call) hands out the same states from
that call (`capturing_hidden_states`), so an EAGLE head drafts for the native step itself.

`FeatureStore` is the hand-over to the drafter: the target's `ModelRunner` enters `store.capture(start)` around
each of its forwards (prefill, plain steps and verify passes alike), and the features of the fed columns land at
those columns of a [B, capacity, 3 H_t] tensor. Only columns the target keeps are ever read (a verify pass's
rejected columns are overwritten by its next pass), so the verify pass hands over the accepted positions, and the
rollback of the target is the store's rollback too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from assisted_backends.drafters.early_exit import decoder_layers_path
from assisted_backends.engine.realign import RowMove


class LayerTap:
    """Hooks that capture the inputs of `layers` (three indices in [0, L]) of `model`'s decoder layers."""

    def __init__(self, model: torch.nn.Module, layers: tuple[int, ...]) -> None:
        native = getattr(model, "capturing_hidden_states", None)
        self.native = native if callable(native) else None  # the native decoder's capture (no hooks: one C++ call)
        self.decoder_layers = model.get_submodule(decoder_layers_path(model))
        self.depth = len(self.decoder_layers)
        self.layers = tuple(layers)
        if any(not 0 <= k <= self.depth for k in self.layers):
            raise ValueError(f"feature layers {list(self.layers)} outside the target's 0..{self.depth}")

    @contextmanager
    def capture(self) -> Iterator[dict[int, torch.Tensor]]:
        """Within the block, forwards of the model fill the yielded dict {layer index: [B, q, H_t]}."""
        if self.native is not None:
            with self.native(self.layers) as captured:
                yield captured
            return
        captured: dict[int, torch.Tensor] = {}
        handles = []
        for k in sorted(set(self.layers)):
            if k < self.depth:

                def before(_module, args, kwargs, k=k):
                    captured[k] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

                handles.append(self.decoder_layers[k].register_forward_pre_hook(before, with_kwargs=True))
            else:

                def after(_module, _args, output, k=k):
                    captured[k] = output[0] if isinstance(output, (tuple, list)) else output

                handles.append(self.decoder_layers[self.depth - 1].register_forward_hook(after))
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()

    def features(self, captured: dict[int, torch.Tensor]) -> torch.Tensor:
        """[B, q, 3 H_t]: the captured states, low, middle, high."""
        missing = [k for k in self.layers if k not in captured]
        if missing:
            raise RuntimeError(f"the target's forward did not run decoder layers {missing}: no features to hand over")
        return torch.cat([captured[k] for k in self.layers], dim=-1)


class FeatureStore:
    """The target's features by column of the slots: `values` [B, columns, 3 H_t], written by the target's runner.

    Allocated at the first forward (its rows are the batch) and grown by doubling when a forward writes past
    its end (a static cache's capacity is known up front: `capacity`)."""

    def __init__(self, tap: LayerTap, capacity: int = 0) -> None:
        self.tap = tap
        self.capacity = capacity
        self.values: torch.Tensor | None = None
        self.missing: str | None = None  # why a forward handed nothing over (a graph replay runs no hooks)

    def _reserve(self, batch: int, end: int, like: torch.Tensor) -> torch.Tensor:
        """`values` with `batch` rows and at least `end` columns (allocated like `like` [., ., 3 H_t], or grown)."""
        values = self.values
        if values is None or values.shape[0] != batch:
            columns = max(end, self.capacity)
            self.values = like.new_zeros(batch, columns, like.shape[2])
        elif end > values.shape[1]:
            grown = values.new_zeros(values.shape[0], max(end, 2 * values.shape[1]), values.shape[2])
            grown[:, : values.shape[1]] = values
            self.values = grown
        return self.values

    def _captured(self, captured: dict[int, torch.Tensor]) -> torch.Tensor | None:
        """[B, q, 3 H_t] the features of one forward, or None (and `missing` says why) where the hooks did not run."""
        if len(captured) < len(set(self.tap.layers)):
            self.missing = "the target's forward ran without its decoder layers' hooks (a captured graph?)"
            return None
        return self.tap.features(captured)

    @contextmanager
    def capture(self, start: int) -> Iterator[None]:
        """Around one target forward that feeds columns [start, start + q): keep their features."""
        with self.tap.capture() as captured:
            yield
        features = self._captured(captured)  # [B, q, 3 H_t]
        if features is not None:
            end = start + features.shape[1]
            self._reserve(features.shape[0], end, features)[:, start:end] = features

    @contextmanager
    def capture_row(self, slot: int, start: int) -> Iterator[None]:
        """Around a one-row forward (a queue's joining prompt, `engine.joins`) whose positions are the columns
        [start, start + q) of the row at `slot`: keep their features there (those before column 0 are padding)."""
        with self.tap.capture() as captured:
            yield
        features = self._captured(captured)  # [1, q, 3 H_t]
        if features is None or self.values is None:
            return
        skip = max(0, -start)
        end = start + features.shape[1]
        with torch.inference_mode():  # as `capture`'s writes, inside the forward's inference mode
            self._reserve(self.values.shape[0], end, features)[slot, start + skip : end] = features[0, skip:]

    def move_rows(self, move: RowMove) -> None:
        """Batches (`engine.realign`): the rows moved; their features move with them."""
        if self.values is not None:
            self.values = move.apply(self.values, seq_dim=1)

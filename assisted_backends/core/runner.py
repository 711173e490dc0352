"""ModelRunner: one causal LM, its KV cache layout, and the one forward call the loop needs."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from assisted_backends.core import hf_compat
from assisted_backends.core.kv_cache import CacheLayout
from assisted_backends.core.rows import RowMove


class ModelRunner:
    """Feeds new tokens to a model on top of its cache and returns the logits.

    Position ids are computed here, not by the model, so left padding and rollback never confuse
    a model's own position bookkeeping. Positions of tokens beyond the model's range (only ever
    fixed-shape filler past the last token that can be committed) are clamped; causality keeps
    them from touching any committed position.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        layout: CacheLayout,
        step_boundary: Callable[[], None] = lambda: None,
    ) -> None:
        self.model = model
        self.layout = layout
        self.step_boundary = step_boundary
        self.forward_count = 0
        limit = hf_compat.max_positions(model)
        self._max_position = (limit - 1) if limit else None
        self._pass_cache_position = hf_compat.forward_accepts(model, "cache_position")
        self._keep_last = hf_compat.logits_to_keep_kwargs(model, 1)

    @property
    def length(self) -> int:
        return self.layout.length

    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed `tokens` [B, q] after the cached positions; return float logits [B, q or 1, V]."""
        query_length = tokens.shape[1]
        start = self.layout.length
        cache_position = torch.arange(start, start + query_length, device=tokens.device)  # [q]
        position_ids = cache_position[None, :] - self.layout.pad[:, None]  # [B, q]
        position_ids = position_ids.clamp(min=0, max=self._max_position)
        kwargs = dict(self._keep_last) if last_only else {}
        if self._pass_cache_position:
            kwargs["cache_position"] = cache_position
        cache, mask = hf_compat.model_inputs(self.layout.cache, self.layout.attention_mask(query_length), query_length)
        with torch.inference_mode():
            output = self.model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                **kwargs,
            )
        hf_compat.keep_returned_cache(self.layout.cache, output)
        self.layout.advance(query_length)
        self.forward_count += 1
        self.step_boundary()
        logits = output.logits
        if last_only:
            logits = logits[:, -1:, :]
        return logits.float()

    def rollback(self, length: int) -> None:
        self.layout.rollback(length)

    def move_rows(self, move: RowMove, pad: torch.Tensor, length: int) -> None:
        """Batches: shift each row's cached positions (`core.rows`); keep at most `length`."""
        self.layout.move_rows(move, pad, length)

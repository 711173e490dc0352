"""A joining prompt's own pass (`engine.joins`, step 3): over a one-row cache, whole or in chunks between the
running rows' rounds (chunked prefill).

`RowPass` holds the prompt x left-padded to `width` columns and the columns fed so far. With a prefix cache
(`engine.prefix_reuse`) it first restores the longest cached prefix of x (never its last token), then `feed(C)`
computes at most C more columns a call; once the last column is fed, `logits` holds the last position's logits
[1, 1, V] and x's blocks go into the prefix cache. `ModelRunner.insert_row` then writes the row into the batch.

Exactness: fed in one pass or in chunks of C, the keys, values and last logits are the same bits where the model
computes each position alone in a fixed order (the native decoder step; `api.prefix.exact_reuse`): the condition
under which a queue chunks at all (`engine.joins.Refill.chunk`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from assisted_backends.engine.kv_cache import CacheLayout
    from assisted_backends.engine.prefix_reuse import PrefixReuse


class ScratchRunner(Protocol):
    """The one-row runner a pass feeds (`engine.runner.ModelRunner` over an empty one-row layout)."""

    layout: CacheLayout
    forward_count: int

    def forward(self, tokens: torch.Tensor, last_only: bool = False, hidden_only: bool = False) -> torch.Tensor: ...


class RowPass:
    """The pass of one joining prompt `prompt` [P], left-padded with `pad_id` to `width` columns, on `scratch`;
    `reuse`: the call's prefix cache (None: every column is computed); `chunkable`: whether it may be fed in
    chunks (not where the pass must run whole: a feature tap capturing it, a static cache's bucket)."""

    def __init__(
        self, scratch: ScratchRunner, prompt: torch.Tensor, width: int, pad_id: int, reuse: PrefixReuse | None,
        chunkable: bool,
    ) -> None:  # fmt: skip
        self.scratch, self.reuse, self.chunkable = scratch, reuse, chunkable
        self.length, self.width = prompt.shape[0], width
        self.tokens = torch.nn.functional.pad(prompt[None], (width - self.length, 0), value=pad_id)  # [1, width]
        self.fed = reuse.restore(scratch.layout, self.tokens) if reuse is not None else 0
        self.logits: torch.Tensor | None = None  # [1, 1, V] once every column is fed

    @property
    def left(self) -> int:
        """Columns still to compute."""
        return self.width - self.fed

    def feed(self, chunk: int | None = None) -> None:
        """Compute the next `chunk` columns (None: all that are left)."""
        end = self.width if chunk is None else min(self.width, self.fed + chunk)
        logits = self.scratch.forward(self.tokens[:, self.fed : end], last_only=True)
        self.fed = end
        if end == self.width:
            self.logits = logits
            if self.reuse is not None:
                self.reuse.store_prompts(self.scratch.layout, self.tokens)

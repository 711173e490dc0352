"""Stop strings and custom stopping criteria, evaluated where plain decoding would evaluate them.

Plain decoding appends one token, then asks its criteria whether to stop (the token that triggered
stays). A round commits up to γ + 1 tokens at once, so `StopCheck.hits` asks the criteria about every
candidate prefix of the round (the committed tokens followed by 1, 2, ..., γ + 1 tokens of the span)
and returns one flag per prefix, still on the device: the loop folds them into the round's one host
transfer and truncates after the first prefix that stops, exactly where plain decoding stops.

The criteria list is built by `options.criteria` (transformers' own `StopStringCriteria` and the
caller's criteria; length and EOS are the loop's own limits). Criteria must be functions of the ids they are given
(transformers' are): prefixes whose last tokens are later rejected are asked too, and discarded.
`scores` handed to a criterion are the target's raw logits [1, V] at the step that chose its last token
(a batch is asked one row at a time).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from assisted_backends.engine.slots import RowStarts

Criterion = Callable[[torch.Tensor, torch.Tensor], object]  # (input_ids [1, L], scores [1, V]) -> bool / [1]


class StopCheck:
    """Evaluates `criteria` on candidate prefixes of the slots' ids.

    `offset`: leading positions `model.generate` would not see (static-shape bucket padding).
    """

    def __init__(self, criteria: list[Criterion], offset: int = 0) -> None:
        self.criteria = criteria
        self.offset = offset

    def _stops(self, prefix: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        flags = [torch.as_tensor(c(prefix, scores), device=prefix.device).reshape(-1)[:1].bool() for c in self.criteria]
        return torch.stack(flags).any()

    def hits(
        self, ids: torch.Tensor, start: int, count: int, logits: torch.Tensor, rows: RowStarts | None = None
    ) -> torch.Tensor:
        """[B, count] bool: whether plain decoding stops after the prefix ids[b, :start + j + 1], for j < count.

        `logits` [B, ≥count, V]: position j is the step that chose token start + j. `rows` (batches): row
        b's prefix begins at column rows.starts[b] (each row is asked alone, as `model.generate` on its prompt).
        """
        starts = rows.starts if rows is not None else [self.offset] * ids.shape[0]
        return torch.stack(
            [
                torch.stack(
                    [self._stops(ids[b : b + 1, first : start + j + 1], logits[b : b + 1, j]) for j in range(count)]
                )
                for b, first in enumerate(starts)
            ]
        )  # [B, count]

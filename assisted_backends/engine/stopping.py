"""Stop strings and custom stopping criteria, evaluated where plain decoding would evaluate them.

Plain decoding appends one token, then asks its criteria whether to stop (the token that triggered
stays). A round commits up to γ + 1 tokens at once, so `StopCheck.hits` asks the criteria about every
candidate prefix of the round (the committed tokens followed by 1, 2, ..., γ + 1 tokens of the span)
and returns one flag per prefix, still on the device: the loop folds them into the round's one host
transfer and truncates after the first prefix that stops, exactly where plain decoding stops.

The criteria list is transformers' own (`model._get_stopping_criteria`: `StopStringCriteria` built
from `stop_strings` and the tokenizer, plus the caller's `stopping_criteria`), minus the max-length
and EOS criteria the loop already applies. Criteria must be functions of the ids they are given
(transformers' are): prefixes whose last tokens are later rejected are asked too, and discarded.
`scores` handed to a criterion are the target's raw logits [1, V] at the step that chose its last token
(a batch is asked one row at a time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteria

from assisted_backends.engine.tokens import RowPrefixes

Criterion = Callable[[torch.Tensor, torch.Tensor], object]  # (input_ids [1, L], scores [1, V]) -> bool / [1]
_LOOP_HANDLED = (MaxLengthCriteria, EosTokenCriteria)


def _check_criteria(stopping_criteria) -> list[Criterion]:
    if stopping_criteria is None:
        return []
    if isinstance(stopping_criteria, StoppingCriteria) or not isinstance(stopping_criteria, Sequence):
        stopping_criteria = [stopping_criteria]
    for criterion in stopping_criteria:
        if not callable(criterion):
            raise TypeError(
                f"stopping_criteria must hold callables (input_ids, scores) -> bool, got {type(criterion).__name__}"
            )
    return list(stopping_criteria)


def build_criteria(model: PreTrainedModel, config: GenerationConfig, stopping_criteria, tokenizer) -> list[Criterion]:
    """The criteria `model.generate` would build for `config` (stop strings) and `stopping_criteria`,
    without those the loop applies itself (length, EOS)."""
    custom = _check_criteria(stopping_criteria)
    stop_strings = getattr(config, "stop_strings", None)
    if stop_strings is not None and tokenizer is None:
        raise ValueError("stop_strings needs the target's tokenizer: pass tokenizer=... (as model.generate does)")
    if stop_strings is None and not custom:
        return []
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    build = getattr(model, "_get_stopping_criteria", None)
    if not callable(build):
        raise NotImplementedError(f"{type(model).__name__} has no _get_stopping_criteria: it is not a generation model")
    custom_list = StoppingCriteriaList(c for c in custom if isinstance(c, StoppingCriteria))
    criteria = build(generation_config=config, stopping_criteria=custom_list, tokenizer=tokenizer)
    plain = [c for c in custom if not isinstance(c, StoppingCriteria)]  # bare callables keep their order, last
    return [c for c in criteria if not isinstance(c, _LOOP_HANDLED)] + plain


class StopCheck:
    """Evaluates `criteria` on candidate prefixes of the token buffer's ids.

    `offset`: leading positions `model.generate` would not see (static-shape bucket padding).
    """

    def __init__(self, criteria: list[Criterion], offset: int = 0) -> None:
        self.criteria = criteria
        self.offset = offset

    def _stops(self, prefix: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        flags = [torch.as_tensor(c(prefix, scores), device=prefix.device).reshape(-1)[:1].bool() for c in self.criteria]
        return torch.stack(flags).any()

    def hits(
        self, ids: torch.Tensor, start: int, count: int, logits: torch.Tensor, rows: RowPrefixes | None = None
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

"""The stopping criteria of a call, split into what the loop applies itself and what it asks.

`model.generate` builds a length criterion (`MaxLengthCriteria`), an EOS criterion (`EosTokenCriteria`)
and one for stop strings, then merges the caller's `stopping_criteria`: a caller's criterion of exactly
the type of a built one *replaces* it ("the custom ... will take precedence"). The loop applies length
and EOS itself, so the caller's criteria of those two types become the call's limits here:

- a caller's `MaxLengthCriteria(max_length=L)` stops after the step where the sequence (padding
  included) reaches L tokens: at least one new token, then L − P; it replaces the config's limit;
- a caller's `EosTokenCriteria(eos_token_id=E)` stops at E instead of the config's EOS ids (several such
  criteria: any of their ids).

Everything else (stop strings, the caller's own criteria) is evaluated by `engine.stopping.StopCheck`
on every candidate prefix of a round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteria,
    StoppingCriteriaList,
)

from assisted_backends.options.errors import refusal

Criterion = Callable[[torch.Tensor, torch.Tensor], object]  # (input_ids [1, L], scores [1, V]) -> bool / [1]


@dataclass(frozen=True)
class Criteria:
    """`asked`: the criteria the loop evaluates on prefixes; `max_length` / `eos_ids`: the caller's own
    length and EOS criteria, which replace the config's (None: not given)."""

    asked: list[Criterion]
    max_length: int | None = None
    eos_ids: list[int] | None = None

    def max_new_tokens(self, config_limit: int, prompt_length: int) -> int:
        """New tokens allowed: the caller's length criterion's when given (at least one), else `config_limit`."""
        return config_limit if self.max_length is None else max(1, self.max_length - prompt_length)


def _callables(stopping_criteria) -> list[Criterion]:
    if stopping_criteria is None:
        return []
    if isinstance(stopping_criteria, StoppingCriteria) or not isinstance(stopping_criteria, Sequence):
        stopping_criteria = [stopping_criteria]
    for criterion in stopping_criteria:
        if not callable(criterion):
            raise refusal("criterion_type", {"found": type(criterion).__name__}, name="stopping_criteria")
        if type(criterion) is MaxTimeCriteria:
            raise refusal("criterion_time", name="stopping_criteria")
    return list(stopping_criteria)


def build_criteria(model: PreTrainedModel, config: GenerationConfig, stopping_criteria, tokenizer) -> Criteria:
    """The criteria `model.generate` would use for `config` (stop strings) and `stopping_criteria`."""
    custom = _callables(stopping_criteria)
    lengths = [c.max_length for c in custom if type(c) is MaxLengthCriteria]
    eos = [int(i) for c in custom if type(c) is EosTokenCriteria for i in c.eos_token_id.reshape(-1).tolist()]
    others = [c for c in custom if type(c) not in (MaxLengthCriteria, EosTokenCriteria)]
    stop_strings = getattr(config, "stop_strings", None)
    if stop_strings is not None and tokenizer is None:
        raise refusal("stop_strings_tokenizer", strings="stop_strings", tokenizer="tokenizer")
    asked: list[Criterion] = []
    if stop_strings is not None or others:
        build = getattr(model, "_get_stopping_criteria", None)
        if not callable(build):
            raise refusal("not_generation_model", {"model": type(model).__name__, "method": "_get_stopping_criteria"},
                          name="model")  # fmt: skip
        without_limits = GenerationConfig(stop_strings=stop_strings)  # length and EOS: the loop's own
        without_limits.max_length = None  # transformers < 5 defaults it to 20
        without_limits._eos_token_tensor = None
        built = build(
            generation_config=without_limits,
            stopping_criteria=StoppingCriteriaList(c for c in others if isinstance(c, StoppingCriteria)),
            tokenizer=tokenizer,
        )
        built = [c for c in built if type(c) not in (MaxLengthCriteria, EosTokenCriteria)]
        asked = built + [c for c in others if not isinstance(c, StoppingCriteria)]  # bare callables last
    return Criteria(asked, min(lengths) if lengths else None, eos or None)

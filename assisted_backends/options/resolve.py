"""Resolving a call's options the way `model.generate` resolves them: one precedence, written once.

Priority, as in transformers: explicit argument > the `generation_config` passed > the model's own
`generation_config` > transformers' defaults (top_k=50 when sampling, 20 new tokens when no length is
given, ...). The merge is transformers' own (`_prepare_generation_config`); the fields this package
cannot honour are refused by name (`fields.REFUSED`), never ignored. The drafting fields
(`prompt_lookup_num_tokens`, `assistant_early_exit`, `num_assistant_tokens`) follow the same precedence,
whichever entry point the call came through.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

import torch
from transformers import GenerationConfig, PreTrainedModel

from assisted_backends import hf_compat
from assisted_backends.engine.sampling import SamplingConfig
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options import fields, prompt, ranges
from assisted_backends.options.criteria import Criteria, build_criteria
from assisted_backends.options.errors import refusal
from assisted_backends.options.processors import special_tokens

DEFAULT_NEW_TOKENS = 20  # transformers' default max_length, counted after the prompt
# Forward inputs that follow the sequence, one value per column, extended as `model.generate` extends them.
COLUMN_INPUTS = ("token_type_ids", "position_ids")
# Forward arguments `model.generate` accepts that never change the tokens.
NO_EFFECT_INPUTS = ("logits_to_keep", "num_logits_to_keep", "use_cache", "return_dict")
# Where a call's length limit came from, after the precedence: max_new_tokens, max_length (it counts the prompt),
# or transformers' default of 20 new tokens.
LimitSource = Literal["max_new_tokens", "max_length", "default"]


@dataclass(frozen=True)
class DraftingFields:
    """The drafting fields after the precedence (None: not set anywhere)."""

    prompt_lookup_num_tokens: int | None = None
    assistant_early_exit: int | None = None
    num_assistant_tokens: int | None = None


@dataclass(frozen=True)
class OutputRequest:
    """What the caller wants back besides the sequences."""

    return_dict: bool = False
    scores: bool = False  # processed scores of each committed token (`output_scores`)
    logits: bool = False  # raw logits of each committed token (`output_logits`)


@dataclass(frozen=True)
class GenerationOptions:
    """What a call generates with, resolved once.

    input_ids [B, P] (user left padding included, as `model.generate` counts it); `user_pad` each row's
    leading masked positions; `attention_mask` the caller's or the inferred one (None: all attended);
    `config` the merged generation config (its max_length what processors see); `max_new_tokens` the
    loop's limit (a caller's `MaxLengthCriteria` replaces the config's); `eos_ids` the ids that end a
    row; `column_inputs` forward inputs given per prompt column ([B, P] each); `limit_source` where the
    config's limit came from (`config_limit`).
    """

    config: GenerationConfig
    input_ids: torch.Tensor
    user_pad: list[int]
    max_new_tokens: int
    eos_ids: list[int] | None
    pad_id: int
    sampling: SamplingConfig
    attention_mask: torch.Tensor | None
    criteria: Criteria
    drafting: DraftingFields = DraftingFields()
    outputs: OutputRequest = OutputRequest()
    column_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    custom_processors: tuple = ()  # the caller's `logits_processor=` list
    prefix_allowed_tokens_fn: Any = None
    limit_source: LimitSource = "max_new_tokens"

    @property
    def config_limit(self) -> int:
        """The new tokens the generation config allows (max_new_tokens, or max_length after the prompt, or the
        default), not a caller's criterion's: what the logits processors are built for."""
        return self.config.max_length - self.input_ids.shape[1]

    @property
    def limit_counts_prompt(self) -> bool:
        """Whether the length limit counts the prompt: max_length set, or a caller's `MaxLengthCriteria`, without
        max_new_tokens (a queue refuses it: its prompts have different lengths)."""
        if self.limit_source == "max_new_tokens":
            return False
        return self.limit_source == "max_length" or self.criteria.max_length is not None


def split_arguments(model: PreTrainedModel, kwargs: dict[str, Any]) -> tuple[dict, dict]:
    """(GenerationConfig fields, forward inputs) of a call's extra keyword arguments, as `model.generate`
    splits them; a name that is neither is a TypeError, a forward input that cannot be served a refusal."""
    known = GenerationConfig().to_dict()
    config_fields, inputs = {}, {}
    for name, value in kwargs.items():
        if name in known and not name.startswith("_"):
            config_fields[name] = value
        elif name in fields.REFUSED_INPUTS or name in fields.REFUSED_ARGUMENTS:
            if value is not None and value is not False:
                reason = fields.REFUSED_INPUTS.get(name) or fields.REFUSED_ARGUMENTS[name]
                raise refusal("refused_argument", {"reason": reason}, name=name)
        elif name in COLUMN_INPUTS or name in NO_EFFECT_INPUTS:
            if name in COLUMN_INPUTS and value is not None:
                inputs[name] = value
        elif hf_compat.forward_accepts(model, name):
            passed = ", ".join(COLUMN_INPUTS)
            raise refusal("forward_argument", {"model": type(model).__name__, "passed": passed}, name=name)
        else:
            raise refusal("unknown_argument", name=name)
    return config_fields, inputs


def merged_config(
    model: PreTrainedModel, generation_config: GenerationConfig | None, explicit: dict
) -> GenerationConfig:
    """The generation config `model.generate(generation_config=..., **explicit)` would use."""
    explicit = {key: value for key, value in explicit.items() if value is not None}
    prepare = getattr(model, "_prepare_generation_config", None)
    if callable(prepare):  # transformers' own merge; explicit arguments go last, as its kwargs do
        config, _ = prepare(copy.deepcopy(generation_config) if generation_config is not None else None)
    else:
        config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
        own = getattr(model, "generation_config", None)
        if own is not None:
            config.update(**own.to_dict(), defaults_only=True)
    config.update(**explicit)
    return config


def user_set(name: str, explicit: dict, *configs: GenerationConfig | None) -> Any:
    """The first value of field `name` a caller set: an explicit argument, else the first config (in
    precedence order) whose value differs from a fresh `GenerationConfig`'s (transformers 4.x configs
    carry `num_assistant_tokens=20` for its own schedule: that is a default, not a choice)."""
    if explicit.get(name) is not None:
        return explicit[name]
    default = getattr(GenerationConfig(), name, None)
    for config in configs:
        value = getattr(config, name, None)
        if value is not None and value != default:
            return value
    return None


def _active(when: fields.Active, value: Any) -> bool:
    """Whether a refused field's `value` asks for what it refuses (`fields.REFUSED`)."""
    if when == "set":
        return value is not None
    if when == "truthy":
        return bool(value)
    if when == "above_one":
        return value is not None and value > 1
    if when == "not_one":
        return value is not None and value != 1
    return False


def refuse_unsupported(config: GenerationConfig | SimpleNamespace | None) -> None:
    """A ValueError naming the first field that changes tokens in a way this package cannot reproduce."""
    for name, when, advice in fields.REFUSED:
        value = getattr(config, name, None)
        if _active(when, value):
            raise refusal("refused_field", {"value": repr(value), "reason": advice}, name=name)


def _config_limit(
    config: GenerationConfig, length_set: bool, prompt_length: int, facts: ModelFacts
) -> tuple[int, LimitSource]:
    """(new tokens the config allows, where that came from): max_new_tokens, else max_length − prompt length
    (left padding counts, as in transformers), else 20 new tokens up to the model's position limit."""
    if config.max_new_tokens is not None:
        return ranges.check_integer("max_new_tokens", config.max_new_tokens, minimum=1), "max_new_tokens"
    if length_set:
        value = int(config.max_length) - prompt_length
        if value < 1:
            raise refusal("max_length_no_room", {"max_length": config.max_length, "prompt": prompt_length},
                          name="max_length")  # fmt: skip
        return value, "max_length"
    limit = prompt_length + DEFAULT_NEW_TOKENS
    if facts.max_positions is not None:
        limit = min(limit, facts.max_positions)
    if limit <= prompt_length:
        raise refusal("prompt_fills_positions", {"prompt": prompt_length, "limit": facts.max_positions},
                      name="input_ids")  # fmt: skip
    return limit - prompt_length, "default"


def resolve(
    model: PreTrainedModel,
    facts: ModelFacts,
    input_ids,
    attention_mask,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
    stopping_criteria=None,
    tokenizer=None,
    logits_processor=None,
    prefix_allowed_tokens_fn=None,
) -> GenerationOptions:
    """Merge the configs, refuse what cannot be honoured, infer the mask, resolve lengths, special tokens,
    stopping criteria, drafting fields and requested outputs."""
    explicit, column_inputs = split_arguments(model, kwargs)
    ranges.check_integer("max_new_tokens", explicit.get("max_new_tokens"), minimum=1)
    ranges.check_integer("max_length", explicit.get("max_length"), minimum=1)
    ranges.check_sampling(*(explicit.get(n) for n in ("do_sample", "temperature", "top_k", "top_p")),
                          explicit.get("repetition_penalty"))  # fmt: skip
    for given in (generation_config, SimpleNamespace(**explicit)):  # before transformers' own validation
        refuse_unsupported(given)
    own = getattr(model, "generation_config", None)
    for name, reason in fields.REFUSED_OUTPUTS.items():
        if user_set(name, explicit, generation_config, own):
            raise refusal("refused_output", {"reason": reason}, name=name)
    drafting = DraftingFields(*(user_set(name, explicit, generation_config, own) for name in fields.DRAFTING))
    outputs = OutputRequest(
        *(bool(user_set(n, explicit, generation_config, own)) for n in fields.OUTPUTS[:3]),
    )
    config = merged_config(model, generation_config, explicit)
    refuse_unsupported(config)
    do_sample = bool(config.do_sample)
    temperature = 1.0 if config.temperature is None else float(config.temperature)
    ranges.check_sampling(do_sample, temperature, config.top_k, config.top_p, config.repetition_penalty)
    if input_ids is None:
        input_ids = prompt.start_ids(None, config.bos_token_id)
        attention_mask = None
    eos_ids, pad_id = special_tokens(model, config, attention_mask is not None, torch.device("cpu"))
    if attention_mask is None:
        attention_mask = prompt.inferred_attention_mask(input_ids, pad_id, eos_ids)
    prompt.check_token_ids(input_ids, facts.input_vocab_size)
    input_ids, user_pad = prompt.validate_prompt(input_ids, attention_mask)
    if prompt.has_holes(attention_mask, user_pad):  # masked columns inside rows: mask and positions per column
        mask = attention_mask.reshape(input_ids.shape).long()
        column_inputs = {"attention_mask": mask, **column_inputs}
        if "position_ids" not in column_inputs and hf_compat.forward_accepts(model, "position_ids"):
            column_inputs["position_ids"] = prompt.positions_from_mask(mask, hf_compat.MASKED_POSITION_ID)
    prompt_length = input_ids.shape[1]
    length_set = user_set("max_length", explicit, generation_config, own) is not None
    config_limit, limit_source = _config_limit(config, length_set, prompt_length, facts)
    asked = stopping_criteria is not None or getattr(config, "stop_strings", None) is not None
    criteria = build_criteria(model, config, stopping_criteria, tokenizer) if asked else Criteria([])
    if limit_source == "default" and criteria.max_length is None:
        warnings.warn(
            f"no max_new_tokens or max_length given: generating up to {config_limit} new tokens (transformers' "
            "default max_length of 20); set max_new_tokens to control the length",
            UserWarning,
            stacklevel=6,  # the caller of `generate`
        )
    config.max_length = prompt_length + config_limit  # what ForcedEOS and the other processors see
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_length
    sampling = SamplingConfig(do_sample, temperature, config.top_k or None, config.top_p, config.repetition_penalty)
    return GenerationOptions(
        config=config,
        input_ids=input_ids,
        user_pad=user_pad,
        max_new_tokens=criteria.max_new_tokens(config_limit, prompt_length) if asked else config_limit,
        eos_ids=criteria.eos_ids if criteria.eos_ids is not None else (eos_ids or None),
        pad_id=pad_id if pad_id is not None else 0,
        sampling=sampling,
        attention_mask=attention_mask,
        criteria=criteria,
        drafting=drafting,
        outputs=outputs,
        column_inputs=_column_inputs(column_inputs, input_ids.shape),
        custom_processors=tuple(logits_processor or ()),
        prefix_allowed_tokens_fn=_prefix_function(prefix_allowed_tokens_fn, input_ids.shape[0]),
        limit_source=limit_source,
    )


def _prefix_function(function, batch: int):
    """`prefix_allowed_tokens_fn(batch_id, ids)`: served for one row (a batch's rows are processed one at a time,
    so the batch index it is given would always be 0)."""
    if function is not None and batch > 1:
        raise refusal("prefix_function_batch", name="prefix_allowed_tokens_fn")
    return function


def _column_inputs(given: dict[str, Any], shape: torch.Size) -> dict[str, torch.Tensor]:
    """The caller's per-column forward inputs, checked to match the prompt's [B, P]."""
    for name, value in given.items():
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(shape):
            found = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise refusal("column_input", {"shape": tuple(shape), "found": found}, name=name)
    return dict(given)

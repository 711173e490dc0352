"""Resolving a call's options the way `model.generate` resolves them: one precedence, written once.

Priority, as in transformers: explicit argument > the `generation_config` passed > the model's own
`generation_config` > transformers' defaults (top_k=50 when sampling, 20 new tokens when no length is
given, ...). The merge is transformers' own (`_prepare_generation_config`); the fields this package
cannot honour are refused by name (`fields.REFUSED`), never ignored. The drafting fields
(`prompt_lookup_num_tokens`, `assistant_early_exit`, `num_assistant_tokens`) follow the same precedence,
whichever entry point the call came through. `build_request` is where a call becomes its `GenerationRequest`
(`options.request`): everything about the call itself is checked there, once.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from types import SimpleNamespace
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from assisted_backends import hf_compat
from assisted_backends.engine.sampling import SamplingConfig
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options import fields, prompt, ranges
from assisted_backends.options.criteria import Criteria, build_criteria
from assisted_backends.options.errors import refusal
from assisted_backends.options.processors import special_tokens
from assisted_backends.options.request import (
    CallArguments,
    CallSettings,
    DraftingFields,
    GenerationOptions,
    GenerationRequest,
    LimitSource,
    OutputRequest,
    QueueShape,
)

DEFAULT_NEW_TOKENS = 20  # transformers' default max_length, counted after the prompt
# Forward inputs that follow the sequence, one value per column, extended as `model.generate` extends them.
COLUMN_INPUTS = ("token_type_ids", "position_ids")
# Forward arguments `model.generate` accepts that never change the tokens.
NO_EFFECT_INPUTS = ("logits_to_keep", "num_logits_to_keep", "use_cache", "return_dict")


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


def build_request(
    model: PreTrainedModel,
    facts: ModelFacts,
    tokenizer: Any,
    call: CallArguments,
    settings: CallSettings = CallSettings(),
    queue: QueueShape | None = None,
) -> GenerationRequest:
    """The `GenerationRequest` of one call (or of a queue's first batch, `queue` its shape): the package's own
    settings checked, the options resolved (`resolve`), what a streamer or a queue cannot serve refused."""
    seed = ranges.check_integer("seed", settings.seed)
    ranges.check_shapes(settings.cache_layout, settings.static_shapes, settings.schedule, None)
    options = resolve(model, facts, tokenizer, call)
    ranges.check_streaming(settings.streaming, options.input_ids.shape[0])
    if queue is not None:
        check_queue_options(options)
    return GenerationRequest(options, dataclasses.replace(settings, seed=seed), queue)


def check_queue_options(options: GenerationOptions) -> None:
    """What a queue of prompts cannot serve per prompt, refused by name (`options.fields.QUEUE_REFUSED`): outputs,
    a prefix function (its batch_id would not name the prompt), a limit that counts the prompt."""
    asked = {
        "output_scores": options.outputs.scores,
        "output_logits": options.outputs.logits,
        "prefix_allowed_tokens_fn": options.prefix_allowed_tokens_fn is not None,
        "max_length": options.limit_counts_prompt,
    }
    for name, value in asked.items():
        if value:
            raise refusal("queue_refused", {"reason": fields.QUEUE_REFUSED[name]}, name=name)


def resolve(model: PreTrainedModel, facts: ModelFacts, tokenizer: Any, call: CallArguments) -> GenerationOptions:
    """Merge the configs, refuse what cannot be honoured, infer the mask, resolve lengths, special tokens,
    stopping criteria, drafting fields and requested outputs."""
    explicit, column_inputs = split_arguments(model, call.arguments)
    given = (explicit, call.generation_config, getattr(model, "generation_config", None))  # in precedence order
    drafting, outputs = _requested(given)
    config = merged_config(model, call.generation_config, explicit)
    refuse_unsupported(config)
    sampling = _sampling(config)
    input_ids, mask = call.input_ids, call.attention_mask
    if input_ids is None:
        input_ids, mask = prompt.start_ids(None, config.bos_token_id), None
    eos_ids, pad_id = special_tokens(model, config, mask is not None, torch.device("cpu"))
    input_ids, user_pad, mask = _prompt(input_ids, mask, pad_id, eos_ids, facts)
    if prompt.has_holes(mask, user_pad):  # masked columns inside rows: mask and positions per column
        column_inputs = _hole_inputs(model, mask.reshape(input_ids.shape).long(), column_inputs)
    prompt_length = input_ids.shape[1]
    config_limit, limit_source = _config_limit(config, user_set("max_length", *given) is not None, prompt_length,
                                               facts)  # fmt: skip
    criteria = _criteria(model, config, call.stopping_criteria, tokenizer)
    if limit_source == "default" and criteria.max_length is None:
        _warn_default_length(config_limit)
    _set_lengths(config, prompt_length, config_limit)
    new_tokens = config_limit  # a caller's `MaxLengthCriteria` replaces the config's limit
    if criteria.max_length is not None:
        new_tokens = criteria.max_new_tokens(config_limit, prompt_length)
    return GenerationOptions(
        config=config,
        input_ids=input_ids,
        user_pad=user_pad,
        max_new_tokens=new_tokens,
        eos_ids=criteria.eos_ids if criteria.eos_ids is not None else (eos_ids or None),
        pad_id=pad_id if pad_id is not None else 0,
        sampling=sampling,
        attention_mask=mask,
        criteria=criteria,
        drafting=drafting,
        outputs=outputs,
        column_inputs=_column_inputs(column_inputs, input_ids.shape),
        custom_processors=tuple(call.logits_processor or ()),
        prefix_allowed_tokens_fn=_prefix_function(call.prefix_allowed_tokens_fn, input_ids.shape[0]),
        limit_source=limit_source,
    )


def _requested(
    given: tuple[dict, GenerationConfig | None, GenerationConfig | None],
) -> tuple[DraftingFields, OutputRequest]:
    """(drafting fields, outputs) the caller set (`given`: explicit arguments, the config passed, the model's),
    after the checks of what was set explicitly or passed: lengths, sampling ranges, refused fields and outputs."""
    explicit, generation_config, _ = given
    ranges.check_integer("max_new_tokens", explicit.get("max_new_tokens"), minimum=1)
    ranges.check_integer("max_length", explicit.get("max_length"), minimum=1)
    ranges.check_sampling(*(explicit.get(n) for n in ("do_sample", "temperature", "top_k", "top_p")),
                          explicit.get("repetition_penalty"))  # fmt: skip
    for passed in (generation_config, SimpleNamespace(**explicit)):  # before transformers' own validation
        refuse_unsupported(passed)
    for name, reason in fields.REFUSED_OUTPUTS.items():
        if user_set(name, *given):
            raise refusal("refused_output", {"reason": reason}, name=name)
    drafting = DraftingFields(*(user_set(name, *given) for name in fields.DRAFTING))
    return drafting, OutputRequest(*(bool(user_set(name, *given)) for name in fields.OUTPUTS[:3]))


def _sampling(config: GenerationConfig) -> SamplingConfig:
    """The merged config's sampling fields, range-checked."""
    do_sample = bool(config.do_sample)
    temperature = 1.0 if config.temperature is None else float(config.temperature)
    ranges.check_sampling(do_sample, temperature, config.top_k, config.top_p, config.repetition_penalty)
    return SamplingConfig(do_sample, temperature, config.top_k or None, config.top_p, config.repetition_penalty)


def _prompt(
    input_ids, attention_mask, pad_id: int | None, eos_ids: list[int] | None, facts: ModelFacts
) -> tuple[torch.Tensor, list[int], torch.Tensor | None]:
    """(input_ids [B, P], each row's left padding, the mask: the caller's, or the one transformers infers from
    `pad_id`). Only a caller's mask is refused for masking a whole row: an inferred one is applied as
    `model.generate` applies it (`prompt.left_padding`)."""
    mask = attention_mask
    if mask is None:
        mask = prompt.inferred_attention_mask(input_ids, pad_id, eos_ids)
    prompt.check_token_ids(input_ids, facts.input_vocab_size)
    input_ids = prompt.validate_prompt(input_ids)
    if attention_mask is not None:
        prompt.check_mask(attention_mask, input_ids)
    return input_ids, prompt.left_padding(mask, input_ids.shape[0]), mask


def _hole_inputs(model: PreTrainedModel, mask: torch.Tensor, given: dict[str, Any]) -> dict[str, Any]:
    """The column inputs of a mask with holes: the mask itself, and the positions `model.generate` derives from it
    (unless the caller gave them, or the model takes none)."""
    inputs = {"attention_mask": mask, **given}
    if "position_ids" not in inputs and hf_compat.forward_accepts(model, "position_ids"):
        inputs["position_ids"] = prompt.positions_from_mask(mask, hf_compat.MASKED_POSITION_ID)
    return inputs


def _criteria(model: PreTrainedModel, config: GenerationConfig, stopping_criteria, tokenizer) -> Criteria:
    """The call's stopping criteria, built only when asked for (`stopping_criteria=` or stop strings)."""
    if stopping_criteria is None and getattr(config, "stop_strings", None) is None:
        return Criteria([])
    return build_criteria(model, config, stopping_criteria, tokenizer)


def _warn_default_length(config_limit: int) -> None:
    warnings.warn(
        f"no max_new_tokens or max_length given: generating up to {config_limit} new tokens (transformers' "
        "default max_length of 20); set max_new_tokens to control the length",
        UserWarning,
        stacklevel=7,  # the caller of `generate`
    )


def _set_lengths(config: GenerationConfig, prompt_length: int, config_limit: int) -> None:
    """The merged config's lengths counted with the prompt: what ForcedEOS and the other processors see."""
    config.max_length = prompt_length + config_limit
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_length


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

"""One line to route an existing script's `model.generate(...)` through this package.

    model = AutoModelForCausalLM.from_pretrained(...)
    assisted_backends.enable(model)          # the one added line
    out = model.generate(**inputs, assistant_model=draft, max_new_tokens=64, streamer=streamer)

`enable(model)` gives this one model instance a `generate` that takes `model.generate`'s arguments
(inputs / input_ids, attention_mask, generation_config, assistant_model, tokenizer,
assistant_tokenizer, prompt_lookup_num_tokens, assistant_early_exit, streamer, stop_strings,
stopping_criteria, return_dict_in_generate and any GenerationConfig field) and hands them to
`assisted_backends.generate`; it returns what `model.generate` returns (the sequences tensor, or a
`GenerateDecoderOnlyOutput` with `.sequences` when `return_dict_in_generate=True`). Plain calls (no
drafter) run through the same loop. What it cannot honour is refused by name (beam search via the
config checks, custom `logits_processor`, `prefix_allowed_tokens_fn`, per-step scores/logits/attentions,
negative prompts), never ignored. Batches (left-padded `input_ids` [B, P] with their mask) are served.
`disable(model)` restores transformers' own method.

It patches nothing in transformers (only the instance), so it works the same on 4.51, 4.55 and 5.x.
transformers' own `generate(custom_generate=<callable>)` hook (5.x) is not used: by the time it calls
the callable, transformers has built its own cache and dropped `assistant_model` and `tokenizer`.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch

from assisted_backends.api import generation as api

# Arguments of `model.generate` (not GenerationConfig fields) and what to do instead when set.
_REFUSED_ARGUMENTS = {
    "logits_processor": "custom logits processors are not supported: use the GenerationConfig fields they implement",
    "prefix_allowed_tokens_fn": "prefix_allowed_tokens_fn is not supported",
    "negative_prompt_ids": "negative prompts (classifier-free guidance) are not supported",
    "negative_prompt_attention_mask": "negative prompts (classifier-free guidance) are not supported",
    "custom_generate": "custom_generate is not supported while assisted_backends is enabled: disable(model) first",
    "synced_gpus": "synced_gpus (ZeRO-3/FSDP) is not supported: see the DeepSpeed tensor-parallel launch instead",
    "inputs_embeds": "inputs_embeds is not supported: pass input_ids",
    "past_key_values": "a caller-provided cache is not supported: the package keeps its own",
    "cache": "a caller-provided cache is not supported: the package keeps its own",  # transformers >= 5.24
}
_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
_DRAFTING = ("prompt_lookup_num_tokens", "assistant_early_exit")
_IGNORED = ("use_cache",)  # no effect on the tokens


def _first_set(*values):
    return next((value for value in values if value is not None), None)


def _without_default_draft_length(config):
    """A copy of `config` without transformers' default `num_assistant_tokens` (20, a setting for its own
    schedule), so that this package's schedule chooses γ; a value the caller changed is kept."""
    if config is None:
        return None
    from transformers import GenerationConfig

    default = GenerationConfig().num_assistant_tokens
    if getattr(config, "num_assistant_tokens", None) != default:
        return config
    config = copy.deepcopy(config)
    config.num_assistant_tokens = None
    return config


class AssistedGenerate:
    """The `generate` that `enable` puts on a model instance; `last_stats` holds the latest call's statistics."""

    def __init__(self, model: torch.nn.Module, defaults: dict[str, Any]) -> None:
        self.model = model
        self.defaults = defaults
        self.last_stats = None

    def __call__(self, inputs: torch.Tensor | None = None, generation_config=None, stopping_criteria=None, **kwargs):
        model = self.model
        for name, advice in _REFUSED_ARGUMENTS.items():
            value = kwargs.pop(name, None)
            if value is not None and value is not False and not (name == "logits_processor" and len(value) == 0):
                raise NotImplementedError(f"model.generate({name}=...) under assisted_backends.enable: {advice}")
        configs = (generation_config, getattr(model, "generation_config", None))
        for name in _OUTPUTS:
            if _first_set(kwargs.pop(name, None), *(getattr(c, name, None) for c in configs)):
                raise NotImplementedError(
                    f"{name}=True is not supported by assisted_backends (it returns sequences only); "
                    "call assisted_backends.disable(model) for transformers' own generate"
                )
        return_dict = _first_set(
            kwargs.pop("return_dict_in_generate", None), *(getattr(c, "return_dict_in_generate", None) for c in configs)
        )
        input_ids = kwargs.pop("input_ids", None)
        if inputs is not None and input_ids is not None:
            raise ValueError("pass the prompt once: either inputs or input_ids")
        for name in _IGNORED:
            kwargs.pop(name, None)
        drafting = {
            name: _first_set(kwargs.pop(name, None), getattr(generation_config, name, None)) for name in _DRAFTING
        }
        arguments = {**self.defaults, **drafting, **kwargs}
        generation_config = _without_default_draft_length(generation_config)
        with torch.no_grad():
            result = api.generate(
                model,
                inputs if inputs is not None else input_ids,
                generation_config=generation_config,
                stopping_criteria=stopping_criteria,
                **arguments,
            )
        self.last_stats = result.stats
        if not return_dict:
            return result.sequences
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=result.sequences)


def _generate_arguments() -> set[str]:
    """Names `assisted_backends.generate` takes as defaults: its keyword arguments and GenerationConfig fields."""
    from transformers import GenerationConfig

    named = inspect.signature(api.generate).parameters
    fields = {name for name in GenerationConfig().to_dict() if not name.startswith("_")}
    return (set(named) - {"model", "input_ids", "generation_fields"}) | fields


def enable(model: torch.nn.Module, **defaults: Any) -> torch.nn.Module:
    """Route `model.generate(...)` of this instance through `assisted_backends.generate`; returns `model`.

    `defaults`: `assisted_backends.generate` arguments for every call (device, dtype, static_shapes,
    schedule, num_assistant_tokens, ...); arguments of the call itself win.
    """
    if not callable(getattr(model, "generate", None)):
        raise TypeError(f"enable() needs a generation model (with .generate), got {type(model).__name__}")
    unknown = sorted(set(defaults) - _generate_arguments())
    if unknown:
        raise TypeError(f"enable() got arguments assisted_backends.generate does not take: {', '.join(unknown)}")
    model.__dict__["generate"] = AssistedGenerate(model, defaults)
    return model


def disable(model: torch.nn.Module) -> torch.nn.Module:
    """Undo `enable(model)`: transformers' own `model.generate` again. A no-op when not enabled."""
    if isinstance(model.__dict__.get("generate"), AssistedGenerate):
        del model.__dict__["generate"]
    return model


def is_enabled(model: torch.nn.Module) -> bool:
    return isinstance(model.__dict__.get("generate"), AssistedGenerate)

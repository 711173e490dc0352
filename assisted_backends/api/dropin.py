"""One line to route an existing script's `model.generate(...)` through this package.

    model = AutoModelForCausalLM.from_pretrained(...)
    assisted_backends.enable(model)          # the one added line
    out = model.generate(**inputs, assistant_model=draft, max_new_tokens=64, streamer=streamer)

`enable(model)` gives this one model instance a `generate` that takes `model.generate`'s arguments and
hands them to `assisted_backends.generate`, which resolves them with `model.generate`'s precedence
(`options.resolve`); it returns what `model.generate` returns: the sequences tensor, or a
`GenerateDecoderOnlyOutput` (`sequences`, and `scores` / `logits` when asked) with
`return_dict_in_generate=True`. Plain calls (no drafter) run through the same loop. What it cannot honour
is refused by name, never ignored (the refusal tables of `options.fields`). `disable(model)`
restores transformers' own method.

It patches nothing in transformers (only the instance), so it works the same on 4.51, 4.55 and 5.x.
transformers' own `generate(custom_generate=<callable>)` hook (5.x) is not used: by the time it calls
the callable, transformers has built its own cache and dropped `assistant_model` and `tokenizer`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from assisted_backends.api.generation import AssistedGenerator, ModelSetup, generate


class AssistedGenerate:
    """The `generate` that `enable` puts on a model instance; `last_stats` holds the latest call's statistics."""

    def __init__(self, model: torch.nn.Module, defaults: dict[str, Any]) -> None:
        self.model = model
        self.defaults = defaults
        self.last_stats = None

    def __call__(self, inputs: torch.Tensor | None = None, generation_config=None, **kwargs: Any):
        input_ids = kwargs.pop("input_ids", None)
        if inputs is not None and input_ids is not None:
            raise ValueError("pass the prompt once: either inputs or input_ids")
        with torch.no_grad():
            result = generate(
                self.model,
                inputs if inputs is not None else input_ids,
                generation_config=generation_config,
                **{**self.defaults, **kwargs},
            )
        self.last_stats = result.stats
        if not result.return_dict:
            return result.sequences
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=result.sequences, scores=result.scores, logits=result.logits)


def _generate_arguments() -> set[str]:
    """Names `enable` takes as defaults: `generate`'s and `AssistedGenerator.plan`'s keyword arguments and
    GenerationConfig fields."""
    from transformers import GenerationConfig

    named = ModelSetup.names() | set(inspect.signature(AssistedGenerator.plan).parameters)
    fields = {name for name in GenerationConfig().to_dict() if not name.startswith("_")}
    return (named - {"model", "input_ids", "arguments", "kwargs", "self", "streaming", "queue"}) | fields


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

"""`generate(...)`: the public entry point, shaped like `model.generate`; `AssistedGenerator` for many calls.

A call is resolved into a frozen plan (`api.plan`), then run (`api.run`). Arguments:
- the prompt: `input_ids` [B, P] (left-padded with its `attention_mask` for a batch; None starts from
  the model's BOS token, as `model.generate` does);
- drafting: `assistant_model` (same vocabulary, or another one with `tokenizer=` and
  `assistant_tokenizer=`), or the GenerationConfig fields `prompt_lookup_num_tokens`,
  `assistant_early_exit` and `num_assistant_tokens`, wherever they are set;
- any GenerationConfig field by name, and the model inputs `model.generate` passes on (`token_type_ids`,
  `position_ids`); unset fields come from `generation_config`, then from the model's own generation
  config, then transformers' defaults (`options.resolve`); fields that change tokens and cannot be
  honoured are refused by name;
- `logits_processor`, `prefix_allowed_tokens_fn`, `stopping_criteria`, `stop_strings` (with
  `tokenizer=`), `streamer`: as in `model.generate`;
- the package's own: `schedule` ("adaptive": γ chosen online, 0 when speculation cannot win; "constant":
  always `num_assistant_tokens`, default 4), `seed`, `cache_layout`, `static_shapes`, and for the device
  `device`, `dtype`, `draft_precision`, `bucket_size` (or a resolved `backend`), and `threads` (CPU threads;
  default: measured once per process, `api.threads`);
- `suffix_cache`: suffix decoding, no draft model (`drafters.suffix`): True drafts from the cache this process keeps
  for the target (every call given True adds its prompts and outputs to it), a `SuffixCache` object from that
  one (share it between calls, generators and queues explicitly); given to `AssistedGenerator` (or `enable`), the
  default of its calls;
- `prefix_cache`: keys and values of earlier prompts' prefixes reused across calls (`api.prefix`): None (default) on
  where that is exact (the native decoder step of a `.gguf` target), True on, False off, or a `PrefixCache`;
  given to `AssistedGenerator`, the default of its calls; `stats.prefix_reused` counts the prompt tokens reused.
Greedy output is token-identical to the target's `model.generate`; sampling draws from the same
distribution (lossless speculative sampling). `model` / `assistant_model` may name a saved model
directory, a `.gguf` file (or a directory holding one) or a Hub id (`loading.open`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from assisted_backends.api import threads as cpu_threads
from assisted_backends.api.plan import GenerationPlan, plan_generation
from assisted_backends.api.prefix import prefix_scope
from assisted_backends.api.queue import DEFAULT_SLOTS, PromptLike, QueueResult, as_prompts, generate_many
from assisted_backends.api.run import GenerateResult, launched_ranks, run
from assisted_backends.backends.base import Backend, BackendOptions, unprepared
from assisted_backends.backends.registry import resolve_backend
from assisted_backends.drafters.suffix.cache import SuffixCache, cache_for
from assisted_backends.engine.prefix_cache import PrefixCache, PrefixScope
from assisted_backends.loading.open import open_arguments
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options import ranges
from assisted_backends.options.errors import refusal
from assisted_backends.options.request import CallArguments, CallSettings, QueueShape
from assisted_backends.options.resolve import build_request

__all__ = ["AssistedGenerator", "GenerateResult", "ModelSetup", "generate", "generate_queue"]

ModelArgument = PreTrainedModel | str | os.PathLike
NAMES = (str, os.PathLike)  # model arguments that name a directory, a .gguf file or a Hub id (`loading.open`)


@dataclass(frozen=True)
class ModelSetup:
    """The draft, the tokenizers and where and how the models run: the arguments every entry point takes besides
    the target (`generate`, `generate_queue`, `AssistedGenerator`, and `enable`'s defaults), spelled once here."""

    assistant_model: ModelArgument | None = None
    tokenizer: Any = None
    assistant_tokenizer: Any = None
    device: str = "auto"
    dtype: str | None = None
    draft_precision: str | None = None
    bucket_size: int | None = None
    backend: Backend | None = None
    threads: int | None = None
    suffix_cache: SuffixCache | bool | None = None
    prefix_cache: PrefixCache | PrefixScope | bool | None = None

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(field.name for field in dataclasses.fields(cls))

    @classmethod
    def split(cls, arguments: dict[str, Any]) -> tuple[ModelSetup, dict[str, Any]]:
        """(the setup named among a call's keyword `arguments`, the rest: the call's own options)."""
        names = cls.names()
        setup = cls(**{name: value for name, value in arguments.items() if name in names})
        return setup, {name: value for name, value in arguments.items() if name not in names}

    def arguments(self) -> dict[str, Any]:
        """The fields as keyword arguments, the objects themselves (not copies, as `dataclasses.asdict` makes)."""
        return {name: getattr(self, name) for name in self.names()}


def check_materialized(model: Any, argument: str) -> None:
    """A model whose weights are on the meta device (no values: built under `init_empty_weights`,
    `device_map="meta"` or `torch.device("meta")`) is refused in one line, before torch's own error (whose advice,
    `to_empty()`, would give uninitialised weights)."""
    parameters = getattr(model, "parameters", None)
    if not callable(parameters):
        return
    if any(parameter.is_meta for parameter in parameters()):
        raise refusal("meta_weights", name=argument)


class AssistedGenerator:
    """A target (and optionally a draft) on a resolved backend, read once, for callers that generate many
    times: `generator.generate(input_ids, **arguments)` per call, `generator.plan(...)` to inspect a call's
    plan without running it. The backend prepares each model once (`Backend.prepare` is idempotent)."""

    def __init__(
        self,
        model: ModelArgument,
        assistant_model: ModelArgument | None = None,
        *,
        tokenizer: Any = None,
        assistant_tokenizer: Any = None,
        device: str = "auto",
        dtype: str | None = None,
        draft_precision: str | None = None,
        bucket_size: int | None = None,
        backend: Backend | None = None,
        threads: int | None = None,
        suffix_cache: SuffixCache | bool | None = None,
        prefix_cache: PrefixCache | PrefixScope | bool | None = None,
    ) -> None:
        ranges.check_integer("bucket_size", bucket_size, minimum=1)
        ranges.check_integer("threads", threads, minimum=1)
        self.threads = threads
        model, assistant_model = unprepared(model), unprepared(assistant_model)  # a backend's wrapper: its model
        if isinstance(model, NAMES) or isinstance(assistant_model, NAMES):
            model, assistant_model, tokenizer, assistant_tokenizer = open_arguments(
                model, assistant_model, tokenizer, assistant_tokenizer, dtype, draft_precision
            )
        check_materialized(model, "model")
        check_materialized(assistant_model, "assistant_model")
        self.model, self.assistant_model = model, assistant_model
        self.tokenizer, self.assistant_tokenizer = tokenizer, assistant_tokenizer
        self.backend = backend or resolve_backend(device, BackendOptions(dtype, draft_precision, bucket_size))
        self.facts = ModelFacts.of(self.model)
        self.draft_facts = ModelFacts.of(self.assistant_model) if self.assistant_model is not None else None
        self.suffix_cache = None if suffix_cache is None else cache_for(suffix_cache, self.model)  # None: off
        # None: on where reuse is exact (`api.prefix.exact_reuse`), which only a model making its own cache can be
        native = callable(getattr(self.model, "new_native_cache", None))
        self.prefix_cache = prefix_scope(prefix_cache, self.model) if prefix_cache is not None or native else None

    def prefix_for(self, value: PrefixCache | PrefixScope | bool | None) -> PrefixScope | None:
        """The prefix cache a call with `prefix_cache=value` uses (None: the generator's own; `api.prefix`)."""
        return self.prefix_cache if value is None else prefix_scope(value, self.model)

    def _set_threads(self) -> None:
        """torch's thread count for a call (`api.threads.for_call`), unless a call without `threads=` finds it
        where the previous call left it."""
        if self.threads is not None or torch.get_num_threads() != cpu_threads.settled:
            cpu_threads.for_call(self.model, self.backend.device, self.threads)

    def plan(
        self,
        input_ids: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        stopping_criteria=None,
        logits_processor=None,
        prefix_allowed_tokens_fn=None,
        schedule: str | None = None,
        seed: int | None = None,
        cache_layout: str | None = None,
        static_shapes: bool = False,
        streaming: bool = False,
        suffix_cache: SuffixCache | bool | None = None,
        queue: QueueShape | None = None,
        **kwargs: Any,
    ) -> GenerationPlan:
        """The plan of `generate(input_ids, ...)` with these arguments; nothing runs. `suffix_cache` (None: the
        generator's own) as `generate` takes it; `queue`: the shape of a queue whose first batch `input_ids` is
        (`api.queue`). The arguments become the call's `GenerationRequest` here, checked once
        (`options.resolve.build_request`), and planning takes that."""
        cache = self.suffix_cache if suffix_cache is None else cache_for(suffix_cache, self.model)
        call = CallArguments(
            input_ids, attention_mask, generation_config, kwargs, stopping_criteria, logits_processor,
            prefix_allowed_tokens_fn,
        )  # fmt: skip
        settings = CallSettings(schedule, seed, cache_layout, static_shapes, streaming, cache)
        request = build_request(self.model, self.facts, self.tokenizer, call, settings, queue)
        return plan_generation(self, request, multi_rank=launched_ranks() is not None)

    def generate(self, input_ids: torch.Tensor | None = None, *, streamer=None, **arguments: Any) -> GenerateResult:
        """Plan and run one call (arguments as `generate` takes them, models and device excepted)."""
        prefix = self.prefix_for(arguments.pop("prefix_cache", None))
        plan = self.plan(input_ids, streaming=streamer is not None, **arguments)
        self._set_threads()
        result = run(plan, self, streamer, prefix)
        if plan.draft.suffix_cache is not None:
            remember_batch(plan.draft.suffix_cache, plan, result.sequences)
        return result

    def generate_many(
        self,
        prompts: Iterable[PromptLike],
        *,
        slots: int = DEFAULT_SLOTS,
        on_finish: Callable[[int, torch.Tensor], None] | None = None,
        **arguments: Any,
    ) -> QueueResult:
        """Many prompts through `slots` batch rows, a slot refilled as soon as its row ends (`api.queue`): a
        `QueueResult` with each prompt's new tokens, in the prompts' order (`on_finish(i, tokens)` as each ends)."""
        self._set_threads()
        cache = self.suffix_cache if arguments.get("suffix_cache") is None else cache_for(arguments["suffix_cache"],
                                                                                          self.model)  # fmt: skip
        if cache is None:
            return generate_many(self, prompts, slots=slots, on_finish=on_finish, **arguments)
        queue = as_prompts(prompts)
        return generate_many(
            self, queue, slots=slots, on_finish=remembering(cache, queue, on_finish), **{**arguments,
                                                                                       "suffix_cache": cache}
        )  # fmt: skip


def remember_batch(cache: SuffixCache, plan: GenerationPlan, sequences: torch.Tensor) -> None:
    """Add each row of a finished call to `cache`: its prompt (without padding), then its new tokens through the
    first end-of-sequence token."""
    options = plan.options
    width = options.input_ids.shape[1]
    eos = set(options.eos_ids or ())
    for row, pad in enumerate(options.user_pad):
        new = sequences[row, width:].tolist()
        end = next((i + 1 for i, token in enumerate(new) if token in eos), len(new))
        cache.add(options.input_ids[row, pad:].tolist() + new[:end])


def remembering(
    cache: SuffixCache, prompts: list[torch.Tensor], on_finish: Callable[[int, torch.Tensor], None] | None
) -> Callable[[int, torch.Tensor], None]:
    """A queue's `on_finish` that first adds prompt i and its new tokens to `cache`, then calls the caller's."""

    def finished(index: int, tokens: torch.Tensor) -> None:
        cache.add(prompts[index].tolist() + tokens.tolist())
        if on_finish is not None:
            on_finish(index, tokens)

    return finished


def generate(model: ModelArgument, input_ids: torch.Tensor | None = None, **arguments: Any) -> GenerateResult:
    """Generate after `input_ids`, assisted by a drafter when one is asked for (see the module docstring):
    `arguments` are `ModelSetup`'s fields (the draft, tokenizers, device, dtype, ...) and the call's options."""
    setup, options = ModelSetup.split(arguments)
    return AssistedGenerator(model, **setup.arguments()).generate(input_ids, **options)


def generate_queue(
    model: ModelArgument,
    prompts: Iterable[PromptLike],
    *,
    slots: int = DEFAULT_SLOTS,
    on_finish: Callable[[int, torch.Tensor], None] | None = None,
    **arguments: Any,
) -> QueueResult:
    """`generate` for many prompts through `slots` batch rows, each slot refilled as its row ends (`api.queue`);
    `ModelSetup`'s fields and the call's options as `generate` takes them."""
    setup, options = ModelSetup.split(arguments)
    generator = AssistedGenerator(model, **setup.arguments())
    return generator.generate_many(prompts, slots=slots, on_finish=on_finish, **options)

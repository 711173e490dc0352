"""`GenerationRequest`: one call as planning takes it, whatever entry point it came through.

`generate`, `AssistedGenerator`, the queues (`generate_queue`, `generate_live`), the drop-in, the command line
and the server all pass their keywords to `AssistedGenerator.plan`, which gathers the caller's arguments
(`CallArguments`: shaped like `model.generate`'s), the package's own (`CallSettings`) and a queue's shape
(`QueueShape`) and has `options.resolve.build_request` resolve and check them, once: the request it returns
holds the resolved options (prompts, merged config, lengths, special tokens, criteria, drafting fields, outputs:
`GenerationOptions`) and is never checked again. Types only: nothing here runs during a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import GenerationConfig

from assisted_backends.engine.sampling import SamplingConfig
from assisted_backends.options.criteria import Criteria

# Where a call's length limit came from, after the precedence: max_new_tokens, max_length (it counts the prompt),
# or transformers' default of 20 new tokens.
LimitSource = Literal["max_new_tokens", "max_length", "default"]


@dataclass(frozen=True)
class CallArguments:
    """A call's arguments as `model.generate` takes them, before the precedence: the prompt (`input_ids` [B, P] or
    None for the BOS start, `attention_mask` as the caller passed it), `generation_config`, `arguments` (every
    other keyword: GenerationConfig fields and forward inputs) and the caller's own objects."""

    input_ids: Any = None
    attention_mask: Any = None
    generation_config: GenerationConfig | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    stopping_criteria: Any = None
    logits_processor: Any = None
    prefix_allowed_tokens_fn: Any = None


@dataclass(frozen=True)
class CallSettings:
    """The package's own arguments of a call (everything else is a GenerationConfig field or a model input)."""

    schedule: str | None = None
    seed: int | None = None
    cache_layout: str | None = None
    static_shapes: bool = False
    streaming: bool = False
    suffix_cache: Any = None  # a `SuffixCache` (resolved by the entry point), or None


@dataclass(frozen=True)
class QueueShape:
    """A queue of prompts (`api.queue`), as planning takes it: `slots` batch rows, each refilled as its row ends,
    for `prompts` prompts whose longest is `longest` tokens (the buffer's width; the schedule's horizon is the
    tokens each slot makes over the queue). A live queue (`context` given: prompts keep arriving, each with its own
    limit) has a buffer of `context` columns and no horizon. `logprobs`: each committed token's log-probability is
    kept, with that many top tokens (`engine.outputs.LogprobRecord`)."""

    slots: int
    prompts: int
    longest: int
    context: int | None = None
    logprobs: int | None = None  # the top tokens kept with each committed token's log-probability (None: none)

    @property
    def live(self) -> bool:
        return self.context is not None


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


@dataclass(frozen=True)
class GenerationRequest:
    """One call, resolved and checked (`options.resolve.build_request`): its `options`, the package's own
    `settings` (the seed checked) and, for a queue of prompts, its `queue` shape (`options` then hold its first
    batch)."""

    options: GenerationOptions
    settings: CallSettings = CallSettings()
    queue: QueueShape | None = None

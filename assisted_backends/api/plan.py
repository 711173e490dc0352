"""`plan_generation`: the pure step of a call, everything decided before a model runs, as one frozen plan.

A call resolves into: its options (`options.resolve`: precedence, lengths, special tokens, criteria),
the drafter (`drafters.factory.plan_drafting`), the schedule (`engine.schedule.choose_schedule`), and
the shapes the backend asks for (cache layout, bucket padding, filler rows, capacity). A queue of prompts
(`api.queue`) plans here too, its shape (`QueueShape`) an input. Every refusal of a call is raised here or
below (`options.fields` holds them), before a model is prepared: `api.run.run` executes what planning
accepted. Nothing here runs or moves a model: a test can inspect a plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from assisted_backends.backends.base import Backend, PaddingPolicy
from assisted_backends.drafters.factory import DraftSpec, drafting_request, plan_drafting
from assisted_backends.engine.schedule import ScheduleSpec, choose_schedule
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options import ranges
from assisted_backends.options.errors import refusal
from assisted_backends.options.fields import (
    DEFAULT_NUM_ASSISTANT_TOKENS,
    MAX_ADAPTIVE_GAMMA,
    QUEUE_REFUSED,
    SUFFIX_MAX_GAMMA,
)
from assisted_backends.options.resolve import GenerationOptions, resolve


@dataclass(frozen=True)
class QueueShape:
    """A queue of prompts (`api.queue`), as planning takes it: `slots` batch rows, each refilled as its row ends,
    for `prompts` prompts whose longest is `longest` tokens (the buffer's width; the schedule's horizon is the
    tokens each slot makes over the queue). A live queue (`context` given: prompts keep arriving, each with its own
    limit) has a buffer of `context` columns and no horizon."""

    slots: int
    prompts: int
    longest: int
    context: int | None = None

    @property
    def live(self) -> bool:
        return self.context is not None


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
class GenerationPlan:
    """A call, resolved.

    `bucket_pad`: columns of bucket padding left of every prompt (static shapes); `filler_rows`: rows added
    to reach the batch bucket (static shapes; copies of row 0 that are never read); `capacity`: columns of
    the token buffer and of each dynamic cache (a static cache rounds it up to the bucket); `head_on_demand`:
    greedy verification may compute the target's head position by position (`engine.head_on_demand`).
    """

    options: GenerationOptions
    draft: DraftSpec
    schedule: ScheduleSpec | None
    layout: str
    padding: PaddingPolicy
    bucket_pad: int
    capacity: int
    filler_rows: int
    head_on_demand: bool
    seed: int | None

    @property
    def static_shapes(self) -> bool:
        return self.padding.static_shapes

    @property
    def max_gamma(self) -> int:
        return self.schedule.gamma if self.schedule is not None else 0

    @property
    def row_pads(self) -> list[int]:
        """[B + filler rows] each row's left padding in the buffer: the caller's, then the bucket's."""
        pads = [pad + self.bucket_pad for pad in self.options.user_pad]
        return pads + pads[:1] * self.filler_rows

    def padded(self, rows: torch.Tensor, value: int, device: torch.device) -> torch.Tensor:
        """[B, P] per-column values (the prompt, a column input) as the buffer holds them: bucket padding with
        `value` on the left, filler rows (copies of row 0) below."""
        rows = torch.nn.functional.pad(rows, (self.bucket_pad, 0), value=value).to(device)
        return torch.cat([rows, rows[:1].expand(self.filler_rows, -1)]) if self.filler_rows else rows

    def agreed_values(self) -> list[int]:
        """What every rank of a multi-rank launch must have planned the same (`distributed.agreement`)."""
        o = self.options
        return [o.max_new_tokens, self.capacity, self.padding.bucket, self.max_gamma, int(self.static_shapes)]


def batch_bucket(batch: int) -> int:
    """The batch size static shapes run `batch` rows at: the next power of two."""
    return 1 << (batch - 1).bit_length()


def plan_generation(
    model: PreTrainedModel,
    facts: ModelFacts,
    backend: Backend,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
    settings: CallSettings = CallSettings(),
    *,
    assistant_model: PreTrainedModel | None = None,
    draft_facts: ModelFacts | None = None,
    tokenizer: Any = None,
    assistant_tokenizer: Any = None,
    stopping_criteria: Any = None,
    logits_processor: Any = None,
    prefix_allowed_tokens_fn: Any = None,
    multi_rank: bool = False,
    queue: QueueShape | None = None,
) -> GenerationPlan:
    """Resolve one call (or a queue's, `queue` its shape) into a `GenerationPlan` (no model runs); every refusal
    is raised here."""
    seed = ranges.check_integer("seed", settings.seed)
    ranges.check_shapes(settings.cache_layout, settings.static_shapes, settings.schedule, None)
    facts.check_rollback("target")
    options = resolve(
        model, facts, input_ids, attention_mask, generation_config, kwargs, stopping_criteria, tokenizer,
        logits_processor, prefix_allowed_tokens_fn,
    )  # fmt: skip
    batch = options.input_ids.shape[0]
    ranges.check_streaming(settings.streaming, batch)
    if queue is not None:
        check_queue_options(options)
    fields = options.drafting
    request = drafting_request(
        assistant_model, fields.prompt_lookup_num_tokens, fields.assistant_early_exit, settings.suffix_cache,
        fields.num_assistant_tokens,
    )  # fmt: skip
    padding = backend.padding(settings.static_shapes)
    static = padding.static_shapes
    draft = plan_drafting(
        facts, request, assistant_model, draft_facts, tokenizer, assistant_tokenizer, settings.suffix_cache, static
    )
    schedule = None
    if draft.speculates:
        gamma = request.num_assistant_tokens
        if draft.lookup_tokens is not None and gamma is not None:
            gamma = draft.lookup_tokens  # γ fixed at the lookup's count, as transformers uses it
        schedule = choose_schedule(
            settings.schedule,
            gamma,
            static,
            draft.lookup_tokens or DEFAULT_NUM_ASSISTANT_TOKENS,
            draft.lookup_tokens or (SUFFIX_MAX_GAMMA if draft.kind == "suffix" else MAX_ADAPTIVE_GAMMA),
            cost_prior=draft.cost_ratio,
            seeded_sampling=options.sampling.do_sample and seed is not None,
            horizon=_horizon(options.max_new_tokens, queue),
            prompt_pass_prior=draft.prompt_pass_ratio,
            acceptance_prior=draft.acceptance_prior,
        )
    layout = "static" if static else (settings.cache_layout or backend.cache_layout_for(model, assistant_model))
    prompt_length = options.input_ids.shape[1]
    bucket_pad = (-prompt_length) % padding.bucket if static else 0
    gamma = schedule.gamma if schedule is not None else None
    longest = prompt_length - min(options.user_pad)  # the longest prompt without its padding
    width = prompt_length + bucket_pad
    if queue is not None and not queue.live:
        longest, width = queue.longest, max(width, queue.longest)
    capacity, cache_length = ranges.capacity_and_keys(
        width, options.max_new_tokens, gamma, layout == "static", padding.bucket
    )
    ranges.check_target_length(longest, options.max_new_tokens, cache_length, facts.max_positions, facts.key_limit)
    if queue is not None and queue.live:  # every prompt plus its own limit fits in `context` (the caller checks)
        capacity, _ = ranges.capacity_and_keys(queue.context, 0, gamma, layout == "static", padding.bucket)
    wants_outputs = options.outputs.scores or options.outputs.logits
    return GenerationPlan(
        options=options,
        draft=draft,
        schedule=schedule,
        layout=layout,
        padding=padding,
        bucket_pad=bucket_pad,
        capacity=capacity,
        filler_rows=batch_bucket(batch) - batch if static else 0,
        head_on_demand=backend.head_on_demand and not static and not multi_rank and not wants_outputs,
        seed=seed,
    )


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
            raise refusal("queue_refused", {"reason": QUEUE_REFUSED[name]}, name=name)


def _horizon(max_new_tokens: int, queue: QueueShape | None) -> int | None:
    """The tokens the schedule plans for: the call's, a queue's slot's over the whole queue, none for a live queue."""
    if queue is None:
        return max_new_tokens
    return None if queue.live else max_new_tokens * math.ceil(queue.prompts / queue.slots)

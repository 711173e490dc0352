"""`plan_generation`: the pure step of a call, everything decided before a model runs, as one frozen plan.

A call arrives as its `GenerationRequest` (`options.request`: its options resolved and checked by
`options.resolve.build_request`) and is planned into: the drafter (`drafters.factory.plan_drafting`), the
schedule (`engine.schedule.choose_schedule`), and the shapes the backend asks for (cache layout, bucket padding,
filler rows, capacity). A queue of prompts (`api.queue`) plans here too, its shape in its request. Every refusal
of a call is raised here or below (`options.fields` holds them), before a model is prepared: `api.run.run`
executes what planning accepted. Nothing here runs or moves a model: a test can inspect a plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from assisted_backends.backends.base import Backend, PaddingPolicy
from assisted_backends.drafters.factory import DraftSpec, drafting_request, plan_drafting
from assisted_backends.engine.schedule import ScheduleChoice, ScheduleSpec, choose_schedule
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options import ranges
from assisted_backends.options.fields import DEFAULT_NUM_ASSISTANT_TOKENS, MAX_ADAPTIVE_GAMMA, SUFFIX_MAX_GAMMA
from assisted_backends.options.ranges import DraftingRequest
from assisted_backends.options.request import GenerationOptions, GenerationRequest, QueueShape


class Models(Protocol):
    """The target and its draft as a call reads them (an `AssistedGenerator`: read once, for every call): the
    models, their facts, their tokenizers and the backend they run on."""

    model: PreTrainedModel
    facts: ModelFacts
    backend: Backend
    assistant_model: PreTrainedModel | None
    draft_facts: ModelFacts | None
    tokenizer: Any
    assistant_tokenizer: Any


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


def plan_generation(models: Models, request: GenerationRequest, multi_rank: bool = False) -> GenerationPlan:
    """Plan `request` (a call's, or a queue's first batch with the queue's shape) on `models` into a
    `GenerationPlan` (no model runs); every refusal not raised by the request's own checks is raised here.
    `multi_rank`: part of a multi-rank launch (no head on demand)."""
    models.facts.check_rollback("target")
    options, settings = request.options, request.settings
    asked = _drafting_asked(models, request)
    backend = models.backend
    padding = backend.padding(settings.static_shapes)
    static = padding.static_shapes
    draft = plan_drafting(
        models.facts, asked, models.assistant_model, models.draft_facts, models.tokenizer, models.assistant_tokenizer,
        settings.suffix_cache, static,
    )  # fmt: skip
    schedule = _schedule(request, asked, draft, static) if draft.speculates else None
    layout = "static" if static else settings.cache_layout
    if layout is None:
        layout = backend.cache_layout_for(models.model, models.assistant_model)
    gamma = schedule.gamma if schedule is not None else None
    # the scores behind every committed token (outputs, a queue's log-probabilities): the head on every position
    queue_logprobs = request.queue is not None and request.queue.logprobs is not None
    keeps_scores = options.outputs.scores or options.outputs.logits or queue_logprobs
    return GenerationPlan(
        options=options,
        draft=draft,
        schedule=schedule,
        layout=layout,
        padding=padding,
        bucket_pad=_bucket_pad(options, padding),
        capacity=_capacity(request, models.facts, padding, layout == "static", gamma),
        filler_rows=batch_bucket(options.input_ids.shape[0]) - options.input_ids.shape[0] if static else 0,
        head_on_demand=backend.head_on_demand and not static and not multi_rank and not keeps_scores,
        seed=settings.seed,
    )


def _drafting_asked(models: Models, request: GenerationRequest) -> DraftingRequest:
    """The drafter the request asks for: its draft model, its drafting fields and its suffix cache, stated."""
    fields = request.options.drafting
    return drafting_request(
        models.assistant_model, fields.prompt_lookup_num_tokens, fields.assistant_early_exit,
        request.settings.suffix_cache, fields.num_assistant_tokens,
    )  # fmt: skip


def _schedule(request: GenerationRequest, asked: DraftingRequest, draft: DraftSpec, static: bool) -> ScheduleSpec:
    """The schedule of a call that drafts: γ fixed at prompt lookup's count where both are given (as transformers
    uses it), the drafter's γ defaults and priors, the horizon of the call or of its queue."""
    options = request.options
    gamma = asked.num_assistant_tokens
    if draft.lookup_tokens is not None and gamma is not None:
        gamma = draft.lookup_tokens
    most = draft.lookup_tokens or (SUFFIX_MAX_GAMMA if draft.kind == "suffix" else MAX_ADAPTIVE_GAMMA)
    choice = ScheduleChoice(
        request.settings.schedule,
        gamma,
        default_gamma=draft.lookup_tokens or DEFAULT_NUM_ASSISTANT_TOKENS,
        max_gamma=most,
        static_shapes=static,
        seeded_sampling=options.sampling.do_sample and request.settings.seed is not None,
        cost_prior=draft.cost_ratio,
        prompt_pass_prior=draft.prompt_pass_ratio,
        horizon=_horizon(options.max_new_tokens, request.queue),
        acceptance_prior=draft.acceptance_prior,
    )
    return choose_schedule(choice)


def _capacity(
    request: GenerationRequest, facts: ModelFacts, padding: PaddingPolicy, static_cache: bool, gamma: int | None
) -> int:
    """The columns of the token buffer and of each dynamic cache: the widest prompt (the queue's longest), its
    bucket padding, the new tokens and γ + 1 (a live queue: its context), after the target's length checks."""
    options, queue = request.options, request.queue
    prompt_length = options.input_ids.shape[1]
    width = prompt_length + _bucket_pad(options, padding)
    longest = prompt_length - min(options.user_pad)  # the longest prompt without its padding
    if queue is not None and not queue.live:
        longest, width = queue.longest, max(width, queue.longest)
    new = options.max_new_tokens
    capacity, cache_length = ranges.capacity_and_keys(width, new, gamma, static_cache, padding.bucket)
    ranges.check_target_length(longest, new, cache_length, facts.max_positions, facts.key_limit)
    if queue is not None and queue.live:  # every prompt plus its own limit fits in `context` (the caller checks)
        capacity, _ = ranges.capacity_and_keys(queue.context, 0, gamma, static_cache, padding.bucket)
    return capacity


def _bucket_pad(options: GenerationOptions, padding: PaddingPolicy) -> int:
    """Columns of bucket padding left of every prompt: up to the next bucket under static shapes, else none."""
    return (-options.input_ids.shape[1]) % padding.bucket if padding.static_shapes else 0


def _horizon(max_new_tokens: int, queue: QueueShape | None) -> int | None:
    """The tokens the schedule plans for: the call's, a queue's slot's over the whole queue, none for a live queue."""
    if queue is None:
        return max_new_tokens
    return None if queue.live else max_new_tokens * math.ceil(queue.prompts / queue.slots)

"""`plan_generation`: the pure step of a call, everything decided before a model runs, as one frozen plan.

A call resolves into: its options (`options.resolve`: precedence, lengths, special tokens, criteria),
the drafter (`drafters.factory.plan_drafting`), the schedule (`engine.schedule.choose_schedule`), and
the shapes the backend asks for (cache layout, bucket padding, filler rows, capacity). Nothing here
runs or moves a model: a test can inspect a plan, and `api.run.run` executes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from assisted_backends.backends.base import Backend, PaddingPolicy
from assisted_backends.drafters.factory import SUFFIX_MAX_GAMMA, DraftSpec, plan_drafting
from assisted_backends.engine.kv_cache import bucketed
from assisted_backends.engine.schedule import ScheduleSpec, choose_schedule
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options import ranges
from assisted_backends.options.errors import OptionError
from assisted_backends.options.resolve import GenerationOptions, resolve

DEFAULT_NUM_ASSISTANT_TOKENS = 4  # γ of the constant schedule when none is given
MAX_ADAPTIVE_GAMMA = 8  # the adaptive schedule's largest γ when num_assistant_tokens is not given


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


def capacity_and_keys(
    width: int, max_new_tokens: int, schedule: ScheduleSpec | None, layout: str, bucket: int
) -> tuple[int, int]:
    """(capacity, keys): the token buffer's columns for prompts `width` columns wide (padding included) and
    `max_new_tokens`, with room for one round's γ + 1 lookahead; the keys a model attends over, which is the
    preallocated static cache, else at most the committed sequence."""
    lookahead = (schedule.gamma + 1) if schedule is not None else 1
    capacity = width + max_new_tokens + lookahead
    return capacity, bucketed(capacity, bucket) if layout == "static" else capacity - lookahead


def check_target_length(facts: ModelFacts, real_prompt: int, max_new_tokens: int, cache_length: int) -> None:
    """Refuse before generating when the positions or the attended keys (padding included) exceed what the
    target's config allows."""
    ranges.check_positions(real_prompt, max_new_tokens, facts.max_positions)
    if facts.key_limit is not None and cache_length > facts.key_limit[1]:
        raise OptionError(
            f"the target would attend over {cache_length} cached positions (prompt with padding + {{name}}, the "
            f"whole preallocated cache under the static layout) but its config's {facts.key_limit[0]} is "
            f"{facts.key_limit[1]}; shorten the prompt or lower {{name}}",
            name="max_new_tokens",
        )


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
) -> GenerationPlan:
    """Resolve one call into a `GenerationPlan` (no model runs)."""
    seed = ranges.check_integer("seed", settings.seed)
    ranges.check_shapes(settings.cache_layout, settings.static_shapes, settings.schedule, None)
    facts.check_rollback("target")
    options = resolve(
        model, facts, input_ids, attention_mask, generation_config, kwargs, stopping_criteria, tokenizer,
        logits_processor, prefix_allowed_tokens_fn,
    )  # fmt: skip
    batch = options.input_ids.shape[0]
    if settings.streaming and batch > 1:
        raise OptionError(
            f"streamer= streams one sequence, but input_ids holds {batch} rows; drop streamer= or generate one "
            "prompt at a time",
            name="streamer",
        )
    fields = options.drafting
    ranges.check_drafting({"assistant_model": assistant_model, **vars(fields), "suffix_cache": settings.suffix_cache})
    draft = plan_drafting(
        facts, assistant_model, draft_facts, tokenizer, assistant_tokenizer,
        fields.prompt_lookup_num_tokens, fields.assistant_early_exit, settings.suffix_cache,
    )  # fmt: skip
    padding = backend.padding(settings.static_shapes)
    static = padding.static_shapes
    schedule = None
    if draft.speculates:
        gamma = fields.num_assistant_tokens
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
            horizon=options.max_new_tokens,
            prompt_pass_prior=draft.prompt_pass_ratio,
            acceptance_prior=draft.acceptance_prior,
        )
    layout = "static" if static else (settings.cache_layout or backend.cache_layout_for(model, assistant_model))
    prompt_length = options.input_ids.shape[1]
    bucket_pad = (-prompt_length) % padding.bucket if static else 0
    capacity, cache_length = capacity_and_keys(
        prompt_length + bucket_pad, options.max_new_tokens, schedule, layout, padding.bucket
    )
    check_target_length(facts, prompt_length - min(options.user_pad), options.max_new_tokens, cache_length)
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

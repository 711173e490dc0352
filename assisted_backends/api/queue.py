"""Many prompts through a fixed number of slots: `AssistedGenerator.generate_many(prompts, slots=8, ...)` and
`generate_queue(model, prompts, slots=8, ...)` (both in `api.generation`, which calls `generate_many` here).

An evaluation set or a server's requests: prompts of different lengths whose answers end at different
tokens (EOS, stop strings, the limit). Fixed batches of B end with their slowest row, and the rounds
before that serve fewer and fewer rows at a cost that does not shrink with them. Here the first B
prompts start as one left-padded batch (its prefill is `generate`'s), and each row that ends frees its
slot for the next prompt of the queue, whose own prompt pass joins the batch (`engine.joins`); the one
loop goes on until the queue is empty and every row has ended. Under static shapes the slot count is
the batch bucket (B rounded up to a power of two), so every slot serves a prompt.

Each prompt's tokens are those `model.generate` gives that prompt alone (greedy; when sampling, its
distribution), whatever its neighbours and whenever it joined (docs/design.md rule 7): its
processors, stop strings and limits are its own. Arguments are `generate`'s, except what belongs to
one batch or counts its padding, which is refused by name: `attention_mask` (prompts come unpadded),
`streamer` (use `on_finish`), `token_type_ids` / `position_ids`, `output_scores` / `output_logits` (use
`logprobs`), `prefix_allowed_tokens_fn`, and `max_length` or a `MaxLengthCriteria` without `max_new_tokens`.

`logprobs=k` (0 ≤ k ≤ 20) keeps, for every token each prompt commits, its log-probability and the k most likely
tokens with theirs (`QueueResult.logprobs`, `engine.outputs.TokenLogprobs`): log softmax of the processed scores
the token was chosen from, the scores `generate(output_scores=True)` returns for that prompt alone, from the
target's verify pass (a rejected draft token never has an entry). Off (None), nothing is computed.

`generate_live` is the same queue fed while it runs (a server's requests, `assisted_backends.serve`): a
`LiveSource` hands over prompts as they arrive, each with its own token limit, the batch grows to `slots`
rows while prompts wait, callers who leave end their rows between rounds, and each row's tokens are handed
over after every round. One call lasts while rows generate; the caller calls again when more prompts come. Its
`logprobs` is a `LogprobRecord` the caller made, filled by prompt index as rows commit (read it in the hooks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from assisted_backends.api.plan import GenerationPlan, Models, batch_bucket
from assisted_backends.api.prefix import prefill_chunk
from assisted_backends.api.run import QueueSettings, decode_plan
from assisted_backends.engine.joins import Arrival, PromptQueue, Refill
from assisted_backends.engine.outputs import LogprobRecord, TokenLogprobs
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.options import ranges
from assisted_backends.options.errors import refusal
from assisted_backends.options.fields import MAX_TOP_LOGPROBS
from assisted_backends.options.processors import row_logits_processors
from assisted_backends.options.request import QueueShape


class LiveSource(Protocol):
    """Prompts arriving while the loop runs, polled between rounds (from the loop's thread): `pending()` counts
    those that may join now, `take()` hands over the next as (its index: 0, 1, ... in the order taken, token ids
    [P], its max_new_tokens, its own logits processors: added to `logits_processor=` for this row alone, e.g.
    `options.penalties`), `cancelled()` names the indices taken whose callers left."""

    def pending(self) -> int: ...

    def take(self) -> tuple[int, torch.Tensor, int, list]: ...

    def cancelled(self) -> list[int]: ...


class Planner(Models, Protocol):
    """What a queue needs of its caller's `AssistedGenerator` (`api.generation`, which calls this module): the
    models, their facts and backend, and the plan of its first batch with the queue's shape (`plan_generation`,
    as every call plans)."""

    def plan(
        self, input_ids: torch.Tensor | None = None, *, queue: QueueShape | None = None, **arguments: Any
    ) -> GenerationPlan: ...

    def prefix_for(self, value: Any) -> Any: ...


DEFAULT_SLOTS = 8
PromptLike = torch.Tensor | list[int] | tuple[int, ...] | Mapping[str, Any]


@dataclass
class QueueResult:
    """`tokens[i]`: the new tokens of prompt i (up to and including its EOS, as `model.generate` gives them,
    without padding); `stats`: the run's statistics, `stats.rows[i]` prompt i's own (its rounds, when it
    joined and finished, in seconds from the start of the call); `logprobs[i]` (with `logprobs=k`, else None): the
    log-probabilities of prompt i's tokens and their top k."""

    tokens: list[torch.Tensor]
    stats: GenerationStats
    logprobs: list[TokenLogprobs] | None = None

    def sequences(self, prompts: Iterable[PromptLike]) -> list[torch.Tensor]:
        """Each prompt followed by its new tokens, as `model.generate` returns one prompt alone."""
        return [torch.cat([p.to(t.device), t]) for p, t in zip(as_prompts(prompts), self.tokens)]


def as_prompts(prompts: Iterable[PromptLike]) -> list[torch.Tensor]:
    """The queue as 1-D token id tensors: a [N, P] tensor's rows, or each item as token ids (a list, a 1-D or
    [1, P] tensor, or a tokenized dataset's row: a mapping with `input_ids`)."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2:
            raise refusal("queue_tensor", {"shape": list(prompts.shape)}, name="prompts")
        items: list = list(prompts.unbind(0))
    else:
        items = list(prompts)
    return [_one_prompt(item, i) for i, item in enumerate(items)]


def _one_prompt(item: PromptLike, index: int) -> torch.Tensor:
    if isinstance(item, Mapping):
        if "input_ids" not in item:
            raise refusal("queue_mapping", {"index": index}, name="prompts")
        item = item["input_ids"]
    ids = torch.as_tensor(item)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex():
        raise refusal("queue_ids", {"index": index}, name="prompts")
    if ids.numel() == 0:
        raise refusal("queue_empty_prompt", {"index": index}, name="prompts")
    return ids.long()


def left_padded(prompts: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, P], attention_mask [B, P]): the prompts right-aligned, as a left-padding tokenizer gives."""
    width = max(p.shape[0] for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, prompt in enumerate(prompts):
        ids[b, width - prompt.shape[0] :] = prompt
        mask[b, width - prompt.shape[0] :] = 1
    return ids, mask


def _processors(generator: Planner, plan: GenerationPlan, prompt: torch.Tensor, own: list | None = None) -> list:
    """The processors `model.generate` builds for `prompt` [P] alone (with `own` added to `logits_processor=`)."""
    options = plan.options
    if own:
        options = replace(options, custom_processors=(*options.custom_processors, *own))
    return row_logits_processors(generator.model, options, prompt[None], [0], generator.backend.device)[0]


def _arrivals(generator: Planner, plan: GenerationPlan, prompts: list[torch.Tensor], first: int) -> Iterator[Arrival]:
    for index in range(first, len(prompts)):
        yield Arrival(index, prompts[index], _processors(generator, plan, prompts[index]))


def _agreed(prompts: list[torch.Tensor]) -> torch.Tensor:
    """Every prompt's ids, then every prompt's length: what every rank of a launch must hold the same."""
    return torch.cat([*prompts, torch.tensor([p.shape[0] for p in prompts])])


def generate_many(
    generator: Planner,
    prompts: Iterable[PromptLike],
    slots: int = DEFAULT_SLOTS,
    on_finish: Callable[[int, torch.Tensor], None] | None = None,
    logprobs: int | None = None,
    **arguments: Any,
) -> QueueResult:
    """Generate after every prompt of `prompts` through `slots` batch rows (see the module docstring);
    `on_finish(i, tokens)` is called as prompt i ends, in the order they end; `logprobs=k`: each token's
    log-probability and top k kept."""
    slots = ranges.check_integer("slots", slots, minimum=1)
    record = LogprobRecord(_top_logprobs(logprobs)) if logprobs is not None else None
    ranges.check_queue_arguments(arguments, on_finish)
    queue = as_prompts(prompts)
    if not queue:
        raise refusal("queue_empty", name="prompts")
    if generator.backend.padding(bool(arguments.get("static_shapes", False))).static_shapes:
        slots = batch_bucket(slots)  # static shapes run the batch bucket: every slot serves a prompt
    first = min(slots, len(queue))
    input_ids, mask = left_padded(queue[:first], 0)
    prefix = generator.prefix_for(arguments.pop("prefix_cache", None))
    chunk = prefill_chunk(arguments.pop("prefill_chunk", None), generator.model)
    shape = QueueShape(slots, len(queue), max(p.shape[0] for p in queue), logprobs=logprobs)
    plan = generator.plan(input_ids, attention_mask=mask, queue=shape, **arguments)
    refill = Refill(
        PromptQueue(_arrivals(generator, plan, queue, first), len(queue) - first),
        plan.options.pad_id,
        plan.padding.bucket if plan.static_shapes else None,
        on_finish,
        chunk=chunk,
    )
    first_processors = [_processors(generator, plan, p) for p in queue[:first]]
    settings = QueueSettings(refill, _agreed(queue), first_processors, record)
    buffer, stats, _ = decode_plan(plan, generator, queue=settings, prefix=prefix)
    stats.record_slots(slots)
    kept = [record.row(i) for i in range(len(queue))] if record is not None else None
    return QueueResult([buffer.results[i] for i in range(len(queue))], stats, kept)


def _top_logprobs(value: Any) -> int:
    """`logprobs=` checked: the top tokens kept with each token's log-probability."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise refusal("queue_logprobs", {"most": MAX_TOP_LOGPROBS, "value": repr(value)}, name="logprobs")
    return value


class _LiveQueue(PromptQueue):
    """A `LiveSource` as the loop's queue: each prompt taken with the processors `model.generate` builds for it."""

    def __init__(self, source: LiveSource, generator: Planner, plan: GenerationPlan) -> None:
        super().__init__(iter(()), 0)
        self.source, self.generator, self.plan = source, generator, plan

    def pending(self) -> int:
        return self.source.pending()

    def take(self) -> Arrival:
        index, prompt, limit, own = self.source.take()
        return Arrival(index, prompt, _processors(self.generator, self.plan, prompt, own), limit)

    def cancelled(self) -> list[int]:
        return self.source.cancelled()


def generate_live(
    generator: Planner,
    source: LiveSource,
    slots: int,
    context: int,
    on_finish: Callable[[int, torch.Tensor], None],
    on_progress: Callable[[int, torch.Tensor], None] | None = None,
    on_round: Callable[[GenerationStats], None] | None = None,
    logprobs: LogprobRecord | None = None,
    **arguments: Any,
) -> GenerationStats:
    """Serve `source` through up to `slots` batch rows until no row generates and nothing waits (see the module
    docstring): every prompt plus its own limit fits in `context` positions (the caller checks); `on_finish(i,
    tokens)` as prompt i ends, `on_progress(i, tokens so far)` for every generating row after each round and
    `on_round(stats)` with the call's statistics; `logprobs` (a `LogprobRecord`, None: off) receives every committed
    token's log-probabilities by prompt index, before the hooks see the token.
    `arguments` are `generate`'s options shared by every row (sampling, drafting, schedule); the dynamic
    layout only (static shapes keep one batch bucket and are refused)."""
    slots = ranges.check_integer("slots", slots, minimum=1)
    ranges.check_queue_arguments(arguments, on_finish, live=True)
    first = [source.take() for _ in range(min(slots, source.pending()))]
    if not first:
        raise refusal("live_nothing", name="source")
    prompts = [prompt for _, prompt, _, _ in first]
    input_ids, mask = left_padded(prompts, 0)
    arguments.pop("max_new_tokens", None)  # each row's own limit; the plan's is the smallest
    prefix = generator.prefix_for(arguments.pop("prefix_cache", None))  # a tenant's scope, or the generator's
    chunk = prefill_chunk(arguments.pop("prefill_chunk", None), generator.model)
    top = logprobs.top if logprobs is not None else None
    shape = QueueShape(slots, len(prompts), max(p.shape[0] for p in prompts), context, top)
    plan = generator.plan(input_ids, attention_mask=mask, max_new_tokens=1, queue=shape, **arguments)
    refill = Refill(_LiveQueue(source, generator, plan), plan.options.pad_id, None, on_finish, slots, on_progress,
                    on_round=on_round, chunk=chunk)  # fmt: skip
    refill.limits.update({index: limit for index, _, limit, _ in first})
    row_processors = [_processors(generator, plan, prompt, own) for _, prompt, _, own in first]
    settings = QueueSettings(refill, _agreed(prompts), row_processors, logprobs)
    _, stats, _ = decode_plan(plan, generator, queue=settings, prefix=prefix)
    return stats

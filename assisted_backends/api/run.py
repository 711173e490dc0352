"""`run`: the short step of a call. Prepare the models, build the decoding state (`engine.state.DecodingState`:
buffer, runners, drafter, selector, settings, statistics, schedule), decode, assemble.

`decode_plan` is the part a queue of prompts shares (`api.queue`): it takes the queue's `Refill` and the
processors of its first rows, and returns the buffer whose `results` hold every row's new tokens."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from assisted_backends.api import model_state
from assisted_backends.api.plan import GenerationPlan, Models
from assisted_backends.api.streaming import StreamSink
from assisted_backends.backends.base import unprepared
from assisted_backends.distributed import agreement
from assisted_backends.drafters.factory import build_drafter
from assisted_backends.engine.drafter import Drafter
from assisted_backends.engine.joins import Refill
from assisted_backends.engine.loop import decode
from assisted_backends.engine.outputs import CommittedScores, LogprobRecord
from assisted_backends.engine.runner import RunnerBuilder
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.schedule import DraftSchedule
from assisted_backends.engine.slots import Slots
from assisted_backends.engine.state import DecodingState, LoopSettings
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.stopping import StopCheck
from assisted_backends.options.processors import logits_processors, row_logits_processors

if TYPE_CHECKING:  # a call without a prefix cache imports none of it
    from assisted_backends.engine.prefix_cache import PrefixScope


@dataclass
class GenerateResult:
    """`sequences` [B, prompt + new] (prompt included, as in transformers) and the run's `stats`; with
    `output_scores` / `output_logits`, one [B, V] tensor per new position in `scores` / `logits`."""

    sequences: torch.Tensor
    stats: GenerationStats
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None
    return_dict: bool = False  # `return_dict_in_generate` after the precedence: what `model.generate` returns


@dataclass(frozen=True)
class QueueSettings:
    """A queue run (`api.queue`): the prompts still waiting (`refill`), every prompt of the queue as every rank
    must have it (`agreed_prompts`: all token ids, then each prompt's length), the per-row processors of the
    first batch's rows (`first_processors`) and the record of the tokens' log-probabilities (`logprobs`: None, off)."""

    refill: Refill
    agreed_prompts: torch.Tensor
    first_processors: list[list]
    logprobs: LogprobRecord | None = None  # each committed token's log-probabilities, kept by the slots


def launched_ranks() -> agreement.RankAgreement | None:
    """The multi-rank launch this process is part of (`RankAgreement.current`); None, without asking, where no
    process group was started."""
    distributed = torch.distributed
    return agreement.RankAgreement.current() if distributed.is_available() and distributed.is_initialized() else None


def run(plan: GenerationPlan, models: Models, streamer=None, prefix: PrefixScope | None = None) -> GenerateResult:
    """Execute `plan` on `models` (the target and its draft), reusing and filling the prefix cache `prefix` (None:
    none); the models' training flags are restored afterwards."""
    options = plan.options
    sink = StreamSink(streamer) if streamer is not None else None
    buffer, stats, record = decode_plan(plan, models, sink, prefix=prefix)
    if sink is not None:
        sink.end()
    sequences = _sequences(options.input_ids, buffer.results, options.pad_id)
    outputs = record.as_outputs() if record is not None else {}
    return GenerateResult(sequences, stats, **outputs, return_dict=options.outputs.return_dict)


def decode_plan(
    plan: GenerationPlan,
    models: Models,
    sink: StreamSink | None = None,
    queue: QueueSettings | None = None,
    prefix: PrefixScope | None = None,
) -> tuple[Slots, GenerationStats, CommittedScores | None]:
    """Prepare the models, build the decoding state of `plan` (a queue's prompts too) and decode; the models'
    training flags are restored afterwards. The committed tokens' scores and logits are recorded only when asked
    for (else None). `prefix`: the prefix cache the prompt passes reuse and finished rows fill (`api.prefix`; never
    under static shapes or a multi-rank launch)."""
    ranks = launched_ranks()  # multi-rank launch: same seed, γ, tokens (None: one process)
    seed = _agreed_seed(plan, ranks, queue) if ranks is not None else plan.seed
    model, assistant_model = models.model, models.assistant_model
    # training mode back as it was after the call (nothing to put back where no module trains)
    with model_state.restored(model, assistant_model) if _training(model, assistant_model) else nullcontext():
        target, draft = _prepared(plan, models)
        buffer = _buffer(plan, models.backend.device, queue)
        state, stats = _decoding_state(plan, buffer, _Built(models, target, draft, sink, queue, ranks), seed)
        if prefix is not None and not (plan.static_shapes or ranks is not None or buffer.columns):
            _reuse_prefixes(state, prefix)  # per-column inputs (types, positions, holes) change the keys
        if sink is not None:
            sink.start(plan.options.input_ids)
        # multi-rank: errors name rank and step; tokens compared
        with agreement.watched(ranks, buffer, stats) if ranks is not None else nullcontext():
            decode(state)
    if state.settings.prefix is not None:
        stats.record_prefix_reused(state.settings.prefix.reused)
    return buffer, stats, state.settings.record


def _reuse_prefixes(state: DecodingState, prefix: PrefixScope) -> None:
    """The target's prompt passes reuse `prefix`'s cache, and rows that end fill it (`engine.prefix_reuse`)."""
    from assisted_backends.engine.prefix_reuse import PrefixReuse  # a call without a prefix cache imports none of it

    reuse = PrefixReuse(prefix, state.target.layout)
    state.target.prefix = reuse
    state.settings.prefix = reuse


@dataclass(frozen=True)
class _Built:
    """What a call's decoding state is built from besides its plan: the models as read (`models`) and as the
    backend prepared them (`target`, `draft`: None when no draft model runs), the streamer's sink, a queue's
    settings and the multi-rank launch (`ranks`: None in one process)."""

    models: Models
    target: PreTrainedModel
    draft: PreTrainedModel | None
    sink: StreamSink | None
    queue: QueueSettings | None
    ranks: agreement.RankAgreement | None


def _agreed_seed(plan: GenerationPlan, ranks: agreement.RankAgreement, queue: QueueSettings | None) -> int | None:
    """The seed every rank of a launch uses, once the ranks agreed on the plan and the prompts."""
    prompts = queue.agreed_prompts if queue is not None else plan.options.input_ids
    return ranks.start(plan.seed, plan.options.sampling.do_sample, prompts, plan.agreed_values())


def _prepared(plan: GenerationPlan, models: Models) -> tuple[PreTrainedModel, PreTrainedModel | None]:
    """(target, draft) as the backend runs them, in evaluation mode (the draft: None unless the plan runs it)."""
    backend = models.backend
    target = backend.prepare(models.model, "target")
    draft = backend.prepare(models.assistant_model, "draft") if plan.draft.runs_draft_model else None
    if _training(target, draft):  # every call: the caller may have called .train() since
        model_state.evaluation_mode(target, draft)
    return target, draft


def _decoding_state(
    plan: GenerationPlan, buffer: Slots, built: _Built, seed: int | None
) -> tuple[DecodingState, GenerationStats]:
    """The call's one decoding state over `buffer` (runners, drafter and its schedule, selector, settings), and
    the statistics it fills."""
    backend = built.models.backend
    runner = RunnerBuilder(
        plan.layout, plan.capacity, plan.padding.bucket, buffer.padding, backend.step_boundary, unprepared
    )  # a draft's runners too (`drafters.factory`): each over the buffer's rows and padding, or some rows
    target_runner = runner(
        built.target, head_on_demand=plan.head_on_demand, limit=built.models.facts.max_positions,
        inputs=buffer if buffer.columns else None,
    )  # fmt: skip
    drafter = build_drafter(
        plan.draft, target_runner, built.draft, runner, plan.static_shapes, len(plan.row_pads),
        built.models.facts.vocab_size, rowwise=built.queue is not None,
    )  # fmt: skip
    schedule = drafter.schedule_for(plan.schedule.build(), buffer) if drafter is not None else None
    stats = _stats(plan, drafter, schedule, backend.name)
    if built.ranks is not None and schedule is not None:
        schedule = built.ranks.schedule(schedule)
    state = DecodingState.build(
        target=target_runner,
        drafter=drafter,
        slots=buffer,
        selector=_selector(plan, built),
        generator=backend.generator(seed),
        settings=_loop_settings(plan, built),
        stats=stats,
        schedule=schedule,
    )
    return state, stats


def _buffer(plan: GenerationPlan, device: torch.device, queue: QueueSettings | None) -> Slots:
    """The token buffer: the prompt with the plan's bucket padding and filler rows, the capacity, the column
    inputs."""
    options = plan.options
    return Slots(
        plan.padded(options.input_ids, options.pad_id, device),
        plan.capacity,
        options.pad_id,
        plan.row_pads,
        plan.filler_rows,
        {name: plan.padded(table, 0, device) for name, table in options.column_inputs.items()},
        queue=queue is not None,  # a queue's rows are realigned even in one slot
        logprobs=queue.logprobs if queue is not None else None,
    )


def _selector(plan: GenerationPlan, built: _Built) -> TokenSelector:
    """The token selector with the processors `model.generate` builds: the batch's, and each row's own where rows
    differ (a batch's rows, or a queue's first rows)."""
    options, model, device = plan.options, built.models.model, built.models.backend.device
    processors = logits_processors(model, options, device)
    row_processors = built.queue.first_processors if built.queue is not None else None
    if len(options.user_pad) > 1 and built.queue is None:
        row_processors = row_logits_processors(model, options, options.input_ids, options.user_pad, device)
    return TokenSelector(options.sampling, processors, plan.bucket_pad, row_processors)


def _loop_settings(plan: GenerationPlan, built: _Built) -> LoopSettings:
    """What every round asks: the limit, the EOS ids, the stop check, the commit hooks, the record of outputs, a
    queue's refill."""
    options, backend = plan.options, built.models.backend
    outputs = options.outputs
    wants_outputs = outputs.scores or outputs.logits
    criteria = options.criteria.asked
    return LoopSettings(
        options.max_new_tokens,
        torch.tensor(options.eos_ids, device=backend.device) if options.eos_ids else None,
        plan.static_shapes,
        backend.synchronize,
        stop=StopCheck(criteria, plan.bucket_pad) if criteria else None,
        on_commit=built.sink.commit if built.sink is not None else None,
        record=CommittedScores(len(options.user_pad), outputs.logits, outputs.scores) if wants_outputs else None,
        refill=built.queue.refill if built.queue is not None else None,
    )


def _stats(
    plan: GenerationPlan, drafter: Drafter | None, schedule: DraftSchedule | None, backend: str
) -> GenerationStats:
    """The call's statistics, named after its drafter, schedule, cache layout and backend."""
    return GenerationStats(
        drafter=drafter.name if drafter else "none",
        schedule=type(schedule).__name__ if schedule is not None else "none",
        cache_layout=plan.layout,
        backend=backend,
    )


def _training(*models: torch.nn.Module | None) -> bool:
    """Whether a module of `models` is in training mode (`api.model_state` has nothing to do where none is)."""
    return any(module.training for model in models if model is not None for module in model.modules())


def _sequences(input_ids: torch.Tensor, new_tokens: dict[int, torch.Tensor], pad_id: int) -> torch.Tensor:
    """[B, P + longest]: each prompt as given, then its new tokens, `pad_id` after a row's end."""
    longest = max(tokens.shape[0] for tokens in new_tokens.values())
    tail = torch.full((input_ids.shape[0], longest), pad_id, dtype=torch.long, device=new_tokens[0].device)
    for row, tokens in new_tokens.items():
        tail[row, : tokens.shape[0]] = tokens
    return torch.cat([input_ids.to(tail.device), tail], dim=1)

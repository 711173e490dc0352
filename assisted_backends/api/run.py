"""`run`: the short step of a call. Prepare the models, build the decoding state (`engine.state.DecodingState`:
buffer, runners, drafter, selector, settings, statistics, schedule), decode, assemble.

`decode_plan` is the part a queue of prompts shares (`api.queue`): it takes the queue's `Refill` and the
processors of its first rows, and returns the buffer whose `results` hold every row's new tokens."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from assisted_backends.api import model_state
from assisted_backends.api.plan import GenerationPlan
from assisted_backends.api.streaming import StreamSink
from assisted_backends.backends.base import Backend, unprepared
from assisted_backends.distributed import agreement
from assisted_backends.drafters.factory import build_drafter
from assisted_backends.engine.joins import Refill
from assisted_backends.engine.loop import decode
from assisted_backends.engine.outputs import CommittedScores
from assisted_backends.engine.runner import RunnerBuilder
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.state import DecodingState, LoopSettings
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.stopping import StopCheck
from assisted_backends.engine.tokens import TokenBuffer
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options.processors import logits_processors, row_logits_processors


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
    must have it (`agreed_prompts`: all token ids, then each prompt's length) and the per-row processors of the
    first batch's rows (`first_processors`)."""

    refill: Refill
    agreed_prompts: torch.Tensor
    first_processors: list[list]


def launched_ranks() -> agreement.RankAgreement | None:
    """The multi-rank launch this process is part of (`RankAgreement.current`); None, without asking, where no
    process group was started."""
    distributed = torch.distributed
    return agreement.RankAgreement.current() if distributed.is_available() and distributed.is_initialized() else None


def run(
    plan: GenerationPlan,
    model: PreTrainedModel,
    facts: ModelFacts,
    backend: Backend,
    assistant_model: PreTrainedModel | None = None,
    streamer=None,
) -> GenerateResult:
    """Execute `plan` on `model` (and its draft); the models' training flags are restored afterwards."""
    options = plan.options
    sink = StreamSink(streamer) if streamer is not None else None
    buffer, stats, record = decode_plan(plan, model, facts, backend, assistant_model, sink)
    if sink is not None:
        sink.end()
    sequences = _sequences(options.input_ids, buffer.results, options.pad_id)
    outputs = record.as_outputs() if record is not None else {}
    return GenerateResult(sequences, stats, **outputs, return_dict=options.outputs.return_dict)


def decode_plan(
    plan: GenerationPlan,
    model: PreTrainedModel,
    facts: ModelFacts,
    backend: Backend,
    assistant_model: PreTrainedModel | None = None,
    sink: StreamSink | None = None,
    queue: QueueSettings | None = None,
) -> tuple[TokenBuffer, GenerationStats, CommittedScores | None]:
    """Prepare the models, build the buffer, runners, drafter and selector of `plan`, and decode (a queue's
    prompts too); the models' training flags are restored afterwards. The committed tokens' scores and logits
    are recorded only when asked for (else None)."""
    options = plan.options
    ranks = launched_ranks()  # multi-rank launch: same seed, γ, tokens (None: one process)
    seed = plan.seed
    if ranks is not None:
        prompts = queue.agreed_prompts if queue is not None else options.input_ids
        seed = ranks.start(seed, options.sampling.do_sample, prompts, plan.agreed_values())
    # training mode back as it was after the call (nothing to put back where no module trains)
    with model_state.restored(model, assistant_model) if _training(model, assistant_model) else nullcontext():
        target = backend.prepare(model, "target")
        draft = backend.prepare(assistant_model, "draft") if plan.draft.runs_draft_model else None
        if _training(target, draft):  # every call: the caller may have called .train() since
            model_state.evaluation_mode(target, draft)
        device = backend.device
        pads = plan.row_pads
        buffer = TokenBuffer(
            plan.padded(options.input_ids, options.pad_id, device),
            plan.capacity,
            options.pad_id,
            pads,
            plan.filler_rows,
            {name: plan.padded(table, 0, device) for name, table in options.column_inputs.items()},
        )
        buffer.batched = buffer.batched or queue is not None  # a queue's rows are realigned even in one slot

        runner = RunnerBuilder(
            plan.layout, plan.capacity, plan.padding.bucket, buffer.padding, backend.step_boundary, unprepared
        )  # a draft's runners too (`drafters.factory`): each over the buffer's rows and padding, or some rows
        target_runner = runner(
            target, head_on_demand=plan.head_on_demand, limit=facts.max_positions,
            inputs=buffer if buffer.columns else None,
        )  # fmt: skip
        drafter = build_drafter(
            plan.draft, target_runner, draft, runner, plan.static_shapes, len(pads), facts.vocab_size,
            rowwise=queue is not None,
        )  # fmt: skip
        custom = list(options.custom_processors)
        processors = logits_processors(
            model, options.config, options.input_ids, options.attention_mask, device, custom,
            options.prefix_allowed_tokens_fn,
        )  # fmt: skip
        row_processors = queue.first_processors if queue is not None else None
        if len(options.user_pad) > 1 and queue is None:
            row_processors = row_logits_processors(
                model, options.config, options.input_ids, options.user_pad, options.config_limit, device, custom
            )
        schedule = drafter.schedule_for(plan.schedule.build(), buffer) if drafter is not None else None
        stats = GenerationStats(
            drafter=drafter.name if drafter else "none",
            schedule=type(schedule).__name__ if schedule is not None else "none",
            cache_layout=plan.layout,
            backend=backend.name,
        )
        outputs = options.outputs
        wants_outputs = outputs.scores or outputs.logits
        record = CommittedScores(len(options.user_pad), outputs.logits, outputs.scores) if wants_outputs else None
        state = DecodingState.build(
            target=target_runner,
            drafter=drafter,
            buffer=buffer,
            selector=TokenSelector(options.sampling, processors, plan.bucket_pad, row_processors),
            generator=backend.generator(seed),
            settings=LoopSettings(
                options.max_new_tokens,
                torch.tensor(options.eos_ids, device=device) if options.eos_ids else None,
                plan.static_shapes,
                backend.synchronize,
                stop=StopCheck(options.criteria.asked, plan.bucket_pad) if options.criteria.asked else None,
                on_commit=sink.commit if sink is not None else None,
                record=record,
                refill=queue.refill if queue is not None else None,
            ),
            stats=stats,
            schedule=(ranks.schedule(schedule) if ranks else schedule) if drafter else None,
        )
        if sink is not None:
            sink.start(options.input_ids)
        # multi-rank: errors name rank and step; tokens compared
        with agreement.watched(ranks, buffer, stats) if ranks is not None else nullcontext():
            decode(state)
    return buffer, stats, record


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

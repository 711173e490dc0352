"""`generate(...)`: the public entry point, shaped like `model.generate`.

This module validates arguments, asks the backend for device, dtype, cache layout and padding,
builds the runners and the drafter, and hands over to `engine.loop.decode`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel

from assisted_backends import hf_compat
from assisted_backends.api import model_state
from assisted_backends.api.streaming import StreamSink
from assisted_backends.backends.base import Backend, BackendOptions
from assisted_backends.backends.registry import resolve_backend
from assisted_backends.distributed import agreement as rank_agreement
from assisted_backends.drafters import factory as drafting
from assisted_backends.engine import stopping
from assisted_backends.engine.kv_cache import LAYOUT_NAMES, bucketed, make_layout
from assisted_backends.engine.loop import LoopSettings, decode
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.schedule import make_schedule
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.tokens import TokenBuffer
from assisted_backends.loading import files as model_files
from assisted_backends.options import checks as input_checks
from assisted_backends.options import resolve as generation_options

DEFAULT_NUM_ASSISTANT_TOKENS = 4  # γ of the constant schedule when none is given
MAX_ADAPTIVE_GAMMA = 8  # the adaptive schedule's largest γ when num_assistant_tokens is not given


@dataclass
class GenerateResult:
    """`sequences` [B, prompt + new] (prompt included, as in transformers) and the run's `stats`."""

    sequences: torch.Tensor
    stats: GenerationStats


def _first_set(*values):
    return next((value for value in values if value is not None), None)


def generate(
    model: PreTrainedModel | str | os.PathLike,
    input_ids: torch.Tensor,
    *,
    assistant_model: PreTrainedModel | str | os.PathLike | None = None,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    num_assistant_tokens: int | None = None,
    schedule: str | None = None,
    seed: int | None = None,
    device: str = "auto",
    cache_layout: str | None = None,
    static_shapes: bool = False,
    dtype: str | None = None,
    draft_precision: str | None = None,
    bucket_size: int | None = None,
    tokenizer=None,
    assistant_tokenizer=None,
    prompt_lookup_num_tokens: int | None = None,
    assistant_early_exit: int | None = None,
    generation_config: GenerationConfig | None = None,
    backend: Backend | None = None,
    stop_strings: str | list[str] | None = None,
    stopping_criteria=None,
    streamer=None,
    **generation_fields,
) -> GenerateResult:
    """Generate up to `max_new_tokens` after `input_ids`, assisted by a drafter when one is asked for.

    Drafting: `assistant_model` (same vocabulary, or another one with `tokenizer=` and
    `assistant_tokenizer=`), `prompt_lookup_num_tokens`, or `assistant_early_exit`. Unset arguments
    come from `generation_config`, then from the model's own generation config, as
    `model.generate` does (explicit argument > `generation_config` > `model.generation_config` >
    transformers' defaults, e.g. top_k=50 when sampling); any other GenerationConfig field can be
    passed by name (`**generation_fields`, as `model.generate(**kwargs)` takes them); fields that
    change tokens and cannot be honoured are refused by name (`options.resolve`). Greedy
    output is token-identical to the target's `model.generate`; sampling draws from the same
    distribution (lossless speculative sampling). The models' training flags are restored after
    the call (they run in eval mode). `dtype`, `draft_precision` and `bucket_size` are
    handed to the backend; `backend` reuses an already-resolved one (its models prepared once).
    `schedule`: "adaptive" (default; γ chosen online, 0 when speculation cannot win, at most
    `num_assistant_tokens` or 8) or "constant" (always `num_assistant_tokens`, default 4; the default
    when `num_assistant_tokens` or static shapes fix γ, and when sampling with a `seed`, so that the
    seed reproduces the tokens: the adaptive γ depends on wall times).
    `stop_strings` (with `tokenizer=`, the target's) and `stopping_criteria` stop where plain decoding
    would; `streamer` (anything with `put`/`end`, e.g. `TextStreamer`) receives the prompt, then each
    round's committed tokens (never a rejected draft token). Integer arguments must be ints, prompt ids
    inside the target's vocabulary (`options.checks`).
    `model` / `assistant_model` may be a `str` or `Path`: a saved model directory, a `.gguf` file (or a
    directory holding one; converted once and cached) or a Hub id, loaded with `from_pretrained`
    (`loading.files`); two strings with different vocabularies also load their tokenizers.
    """
    model, assistant_model, tokenizer, assistant_tokenizer = model_files.load_arguments(
        model, assistant_model, tokenizer, assistant_tokenizer
    )
    max_new_tokens, seed, num_assistant_tokens = input_checks.check_call(
        model, input_ids, max_new_tokens, seed, num_assistant_tokens
    )
    if streamer is not None and isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] > 1:
        raise ValueError(
            f"streamer= streams one sequence, but input_ids holds {input_ids.shape[0]} rows; drop streamer= "
            "or generate one prompt at a time"
        )
    sink = StreamSink(streamer) if streamer is not None else None
    explicit = dict(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        **generation_options.config_fields(generation_fields),
        stop_strings=stop_strings,
    )
    options = generation_options.resolve(model, input_ids, attention_mask, generation_config, explicit)
    input_ids, user_pad, max_new_tokens = options.input_ids, options.user_pad, options.max_new_tokens
    sampling, eos_ids, pad_id = options.sampling, options.eos_ids, options.pad_id
    gamma = _first_set(num_assistant_tokens, getattr(generation_config, "num_assistant_tokens", None))
    if gamma is not None and int(gamma) < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {gamma}")
    if cache_layout is not None and cache_layout not in LAYOUT_NAMES:
        raise ValueError(f"cache_layout={cache_layout!r} is not one of {LAYOUT_NAMES}")
    if static_shapes and cache_layout == "dynamic":
        raise ValueError("static_shapes=True needs the static cache layout; drop cache_layout='dynamic'")

    criteria = stopping.build_criteria(model, options.config, stopping_criteria, tokenizer)
    translation_tokenizer = input_checks.drafting_tokenizer(
        model, assistant_model, tokenizer, assistant_tokenizer, drafting.vocab_size
    )
    spec = drafting.DraftSpec(
        assistant_model, translation_tokenizer, assistant_tokenizer, prompt_lookup_num_tokens, assistant_early_exit
    )
    drafting.validate(spec, model)
    hf_compat.check_rollback_supported(model, "target")
    if assistant_model is not None:
        hf_compat.check_rollback_supported(assistant_model, "assistant_model")
    gamma = drafting.draft_length(spec, gamma)
    if bucket_size is not None and bucket_size < 1:
        raise ValueError(f"bucket_size must be >= 1, got {bucket_size}")
    backend = backend or resolve_backend(device, BackendOptions(dtype, draft_precision, bucket_size))
    policy = backend.padding(static_shapes)
    layout_name = "static" if static_shapes else (cache_layout or backend.cache_layout_for(model, assistant_model))
    gamma_limit = drafting.max_draft_length(spec)  # prompt lookup: its token count (constant γ, adaptive max)
    draft_schedule = make_schedule(
        schedule,
        gamma,
        policy.fixed_draft_length,
        gamma_limit or DEFAULT_NUM_ASSISTANT_TOKENS,
        gamma_limit or MAX_ADAPTIVE_GAMMA,
        cost_prior=drafting.parameter_ratio(spec, model),
        seeded_sampling=sampling.do_sample and seed is not None,
        horizon=max_new_tokens,
        prompt_pass_prior=drafting.prompt_pass_ratio(spec, model),
    )
    max_gamma = getattr(draft_schedule, "gamma", None) or draft_schedule.max_gamma

    prompt_length = input_ids.shape[1]
    bucket_pad = (-prompt_length) % policy.bucket if policy.pad_prompt else 0
    real_prompt = prompt_length - min(user_pad)  # the longest row
    lookahead = max_gamma + 1 if spec.speculates else 1
    capacity = prompt_length + bucket_pad + max_new_tokens + lookahead
    # Keys a model attends over: the preallocated static cache, else at most the committed sequence.
    cache_length = bucketed(capacity, policy.bucket) if layout_name == "static" else capacity - lookahead
    generation_options.check_length(model, "target", real_prompt, max_new_tokens, cache_length)
    if assistant_model is not None and spec.tokenizer is None:  # same-vocabulary draft: it sees every position
        generation_options.check_length(assistant_model, "assistant_model", real_prompt, max_new_tokens, cache_length)
    ranks = rank_agreement.RankAgreement.current()  # multi-rank launch: same seed, γ, tokens (None: one process)
    if ranks is not None:
        checked = [max_new_tokens, capacity, cache_length, policy.bucket, max_gamma, int(policy.fixed_draft_length)]
        seed = ranks.start(seed, sampling.do_sample, input_ids, checked)

    with model_state.restored(model, assistant_model):  # training mode back as it was after the call
        target = backend.prepare(model, "target")
        draft = backend.prepare(assistant_model, "draft") if assistant_model is not None else None
        model_state.evaluation_mode(target, draft)  # every call: the caller may have called .train() since
        device_ = backend.device
        processors = generation_options.logits_processors(model, options, options.attention_mask, device_)
        row_processors = (
            generation_options.row_logits_processors(model, options, device_) if len(user_pad) > 1 else None
        )
        prompt = torch.nn.functional.pad(input_ids, (bucket_pad, 0), value=int(pad_id)).to(device_)
        pads = [row_pad + bucket_pad for row_pad in user_pad]  # [B]
        riders = batch_bucket(len(pads)) - len(pads) if policy.fixed_draft_length else 0
        if riders:  # static shapes: the batch too comes from a bounded set; copies of row 0 ride along, unread
            prompt = torch.cat([prompt, prompt[:1].expand(riders, -1)])
            pads += pads[:1] * riders

        def runner(m: PreTrainedModel, rows: list[int] | None = None, head_on_demand: bool = False) -> ModelRunner:
            """A runner for `m` over the batch's rows (`rows`: those batch positions only)."""
            row_pads = pads if rows is None else [pads[b] for b in rows]
            layout = make_layout(layout_name, m, torch.tensor(row_pads, device=device_), capacity, policy.bucket)
            return ModelRunner(m, layout, step_boundary=backend.step_boundary, head_on_demand=head_on_demand)

        # the head on demand varies shapes and reads the acceptance per head call: one process,
        # dynamic shapes, a backend whose host reads are free (`engine.head_on_demand`)
        head_on_demand = backend.head_on_demand and not policy.fixed_draft_length and ranks is None
        target_runner = runner(target, head_on_demand=head_on_demand)
        drafter = drafting.build_drafter(
            spec, target, draft, runner, policy.fixed_draft_length, len(pads), target_runner=target_runner
        )
        buffer = TokenBuffer(prompt, capacity, int(pad_id), pads, riders)
        eos_tensor = torch.tensor(eos_ids, device=device_) if eos_ids else None
        stats = GenerationStats(
            drafter=drafter.name if drafter else "none",
            schedule=type(draft_schedule).__name__ if drafter else "none",
            cache_layout=layout_name,
            backend=backend.name,
        )
        if sink is not None:
            sink.start(input_ids)
        with rank_agreement.watched(ranks, buffer, stats):  # multi-rank: errors name rank and step; tokens compared
            decode(
                target=target_runner,
                drafter=drafter,
                buffer=buffer,
                selector=TokenSelector(sampling, processors, offset=bucket_pad, row_processors=row_processors),
                schedule=(ranks.schedule(draft_schedule) if ranks else draft_schedule) if drafter else None,
                generator=backend.generator(seed),
                settings=LoopSettings(
                    max_new_tokens,
                    eos_tensor,
                    policy.fixed_draft_length,
                    backend.synchronize,
                    stop=stopping.StopCheck(criteria, offset=bucket_pad) if criteria else None,
                    on_commit=sink.commit if sink is not None else None,
                ),
                stats=stats,
            )
    if sink is not None:
        sink.end()
    return GenerateResult(sequences=_sequences(input_ids, buffer.results, int(pad_id)), stats=stats)


def batch_bucket(batch: int) -> int:
    """The batch size static shapes run `batch` rows at: the next power of two."""
    return 1 << (batch - 1).bit_length()


def _sequences(input_ids: torch.Tensor, new_tokens: dict[int, torch.Tensor], pad_id: int) -> torch.Tensor:
    """[B, P + longest]: each prompt as given, then its new tokens, `pad_id` after a row's end."""
    longest = max(tokens.shape[0] for tokens in new_tokens.values())
    tail = torch.full((input_ids.shape[0], longest), pad_id, dtype=torch.long, device=new_tokens[0].device)
    for row, tokens in new_tokens.items():
        tail[row, : tokens.shape[0]] = tokens
    return torch.cat([input_ids.to(tail.device), tail], dim=1)

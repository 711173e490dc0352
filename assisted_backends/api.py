"""`generate(...)`: the public entry point, shaped like `model.generate`.

This module validates arguments, asks the backend for device, dtype, cache layout and padding,
builds the runners and the drafter, and hands over to `core.loop.decode`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel

from assisted_backends import drafting
from assisted_backends.backends.base import Backend, BackendOptions
from assisted_backends.backends.registry import resolve_backend
from assisted_backends.core import hf_compat
from assisted_backends.core.kv_cache import LAYOUT_NAMES, make_layout
from assisted_backends.core.loop import LoopSettings, decode
from assisted_backends.core.runner import ModelRunner
from assisted_backends.core.sampling import SamplingConfig, TokenSelector
from assisted_backends.core.schedule import make_schedule
from assisted_backends.core.stats import GenerationStats
from assisted_backends.core.tokens import TokenBuffer

DEFAULT_NUM_ASSISTANT_TOKENS = 4  # γ of the constant schedule when none is given
MAX_ADAPTIVE_GAMMA = 8  # the adaptive schedule's largest γ when num_assistant_tokens is not given


@dataclass
class GenerateResult:
    """`sequences` [B, prompt + new] (prompt included, as in transformers) and the run's `stats`."""

    sequences: torch.Tensor
    stats: GenerationStats


def _first_set(*values):
    return next((value for value in values if value is not None), None)


def _as_id_list(value) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _validate_prompt(input_ids, attention_mask) -> tuple[torch.Tensor, int]:
    """Return input_ids as [1, P] long and its number of left-padding positions."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be a torch.LongTensor of shape [batch, length], got {type(input_ids).__name__}"
        )
    if input_ids.dim() == 1:
        input_ids = input_ids[None, :]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [batch, length], got {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token (add a BOS token for an empty text)")
    if input_ids.shape[0] != 1:
        raise NotImplementedError(
            f"batch size {input_ids.shape[0]} is not supported yet: assisted decoding runs one prompt at a time; "
            "call generate once per prompt"
        )
    if attention_mask is None:
        return input_ids.long(), 0
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids {tuple(input_ids.shape)}; "
            "they must match"
        )
    mask = attention_mask[0].bool()
    pad = int((~mask).long().cumprod(0).sum())  # leading zeros
    if not bool(mask[pad:].all()):
        raise ValueError("attention_mask must be left padding only (zeros, then ones); got zeros after the first one")
    if pad == input_ids.shape[1]:
        raise ValueError("attention_mask masks every prompt token: the prompt needs at least one real token")
    return input_ids.long(), pad


def _sampling_config(do_sample, temperature, top_k, top_p, repetition_penalty, generation_config) -> SamplingConfig:
    config = generation_config or GenerationConfig()
    do_sample = bool(_first_set(do_sample, config.do_sample, False))
    temperature = float(_first_set(temperature, config.temperature, 1.0))
    top_k = _first_set(top_k, config.top_k)
    top_p = _first_set(top_p, config.top_p)
    repetition_penalty = _first_set(repetition_penalty, getattr(config, "repetition_penalty", None))
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}; use do_sample=False for greedy")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if repetition_penalty is not None and repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
    return SamplingConfig(do_sample, temperature, top_k or None, top_p, repetition_penalty)


def _check_length(model: PreTrainedModel, role: str, needed: int, prompt_length: int, max_new_tokens: int) -> None:
    limit = hf_compat.max_positions(model)
    if limit is not None and needed > limit:
        raise ValueError(
            f"prompt ({prompt_length} tokens) + max_new_tokens ({max_new_tokens}) = {needed} exceeds the {role}'s "
            f"{limit} positions; shorten the prompt or lower max_new_tokens"
        )


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    assistant_model: PreTrainedModel | None = None,
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
) -> GenerateResult:
    """Generate up to `max_new_tokens` after `input_ids`, assisted by a drafter when one is asked for.

    Drafting: `assistant_model` (same vocabulary, or another one with `tokenizer=` and
    `assistant_tokenizer=`), `prompt_lookup_num_tokens`, or `assistant_early_exit`. Unset arguments
    come from `generation_config`, then (EOS, pad) from the model's own generation config, as
    `model.generate` does; sampling defaults are greedy, temperature 1.0, no top-k/top-p. Greedy
    output is token-identical to the target decoding alone; sampling draws from the same
    distribution (lossless speculative sampling). `dtype`, `draft_precision` and `bucket_size` are
    handed to the backend; `backend` reuses an already-resolved one (its models prepared once).
    `schedule`: "adaptive" (default; γ chosen online, 0 when speculation cannot win, at most
    `num_assistant_tokens` or 8) or "constant" (always `num_assistant_tokens`, default 4; the default
    when `num_assistant_tokens` or static shapes fix γ, and when sampling with a `seed`, so that the
    seed reproduces the tokens: the adaptive γ depends on wall times).
    """
    config = generation_config or GenerationConfig()
    model_config = getattr(model, "generation_config", None) or GenerationConfig()
    max_new_tokens = _first_set(max_new_tokens, config.max_new_tokens)
    if max_new_tokens is None:
        raise ValueError("max_new_tokens is required (as an argument or in generation_config)")
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    max_new_tokens = int(max_new_tokens)
    gamma = _first_set(
        num_assistant_tokens, getattr(config, "num_assistant_tokens", None) if generation_config else None
    )
    if gamma is not None and int(gamma) < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {gamma}")
    if cache_layout is not None and cache_layout not in LAYOUT_NAMES:
        raise ValueError(f"cache_layout={cache_layout!r} is not one of {LAYOUT_NAMES}")
    if static_shapes and cache_layout == "dynamic":
        raise ValueError("static_shapes=True needs the static cache layout; drop cache_layout='dynamic'")
    sampling = _sampling_config(do_sample, temperature, top_k, top_p, repetition_penalty, generation_config)
    eos_ids = _as_id_list(_first_set(eos_token_id, config.eos_token_id, model_config.eos_token_id))
    pad_id = _first_set(pad_token_id, config.pad_token_id, model_config.pad_token_id, (eos_ids or [0])[0])
    input_ids, user_pad = _validate_prompt(input_ids, attention_mask)

    spec = drafting.DraftSpec(
        assistant_model, tokenizer, assistant_tokenizer, prompt_lookup_num_tokens, assistant_early_exit
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
    draft_schedule = make_schedule(
        schedule,
        gamma,
        policy.fixed_draft_length,
        DEFAULT_NUM_ASSISTANT_TOKENS,
        MAX_ADAPTIVE_GAMMA,
        cost_prior=drafting.parameter_ratio(spec, model),
        seeded_sampling=sampling.do_sample and seed is not None,
    )
    max_gamma = getattr(draft_schedule, "gamma", None) or draft_schedule.max_gamma

    prompt_length = input_ids.shape[1]
    bucket_pad = (-prompt_length) % policy.bucket if policy.pad_prompt else 0
    real_prompt = prompt_length - user_pad
    _check_length(model, "target", real_prompt + max_new_tokens, real_prompt, max_new_tokens)

    target = backend.prepare(model, "target")
    draft = backend.prepare(assistant_model, "draft") if assistant_model is not None else None
    device_ = backend.device
    prompt = torch.nn.functional.pad(input_ids, (bucket_pad, 0), value=int(pad_id)).to(device_)
    pad = torch.tensor([user_pad + bucket_pad], device=device_)  # [B]
    lookahead = max_gamma + 1 if spec.speculates else 1
    capacity = prompt.shape[1] + max_new_tokens + lookahead

    def runner(m: PreTrainedModel) -> ModelRunner:
        layout = make_layout(layout_name, m, pad, capacity, policy.bucket)
        return ModelRunner(m, layout, step_boundary=backend.step_boundary)

    drafter = drafting.build_drafter(spec, target, draft, runner, policy.fixed_draft_length)
    buffer = TokenBuffer(prompt, capacity, int(pad_id))
    eos_tensor = torch.tensor(eos_ids, device=device_) if eos_ids else None
    stats = GenerationStats(
        drafter=drafter.name if drafter else "none",
        schedule=type(draft_schedule).__name__ if drafter else "none",
        cache_layout=layout_name,
        backend=backend.name,
    )
    decode(
        target=runner(target),
        drafter=drafter,
        buffer=buffer,
        selector=TokenSelector(sampling),
        schedule=draft_schedule if drafter else None,
        generator=backend.generator(seed),
        settings=LoopSettings(max_new_tokens, eos_tensor, policy.fixed_draft_length, backend.synchronize),
        stats=stats,
    )
    return GenerateResult(sequences=buffer.committed()[:, bucket_pad:].clone(), stats=stats)

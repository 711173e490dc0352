"""Resolving `generate(...)`'s options the way `model.generate` resolves them.

Priority, as in transformers: explicit argument > the `generation_config` passed > the model's own
`generation_config` > transformers' defaults (top_k=50 when sampling, ...). The merge and the logits
processors are transformers' own (`_prepare_generation_config`, `_get_logits_processor`), so every
processor `model.generate` would apply is applied here in the same order; the fields this package
cannot honour are refused by name (`REFUSED`), never ignored.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.logits_process import LogitsProcessor, LogitsProcessorList

from assisted_backends import hf_compat
from assisted_backends.engine.sampling import SamplingConfig

# Fields that change the tokens and are honoured (transformers' own processors, or the loop's lengths/EOS).
HONOURED = frozenset(
    {
        "max_length", "max_new_tokens", "min_length", "min_new_tokens", "do_sample", "temperature", "top_k",
        "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
        "encoder_repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
        "renormalize_logits", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
        "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
        "eos_token_id", "pad_token_id", "stop_strings",
    }
)  # fmt: skip

# Fields that change tokens and cannot be honoured: (field, is it active?, what to do instead).
REFUSED: tuple[tuple[str, object, str], ...] = (
    ("num_beams", lambda v: v is not None and v > 1, "beam search is not supported: use num_beams=1"),
    ("num_beam_groups", lambda v: v is not None and v > 1, "group beam search is not supported: use 1"),
    ("diversity_penalty", lambda v: bool(v), "group beam search is not supported: leave it unset"),
    ("length_penalty", lambda v: False, ""),  # beam search only: no effect with one beam
    ("penalty_alpha", lambda v: bool(v), "contrastive search is not supported: leave it unset"),
    ("dola_layers", lambda v: v is not None, "DoLa decoding is not supported: leave it unset"),
    ("guidance_scale", lambda v: v is not None and v != 1, "classifier-free guidance is not supported"),
    ("watermarking_config", lambda v: v is not None, "watermarking is not supported: leave it unset"),
    ("num_return_sequences", lambda v: v is not None and v > 1, "call generate once per sequence"),
    ("max_time", lambda v: v is not None, "a wall-clock limit makes the tokens timing-dependent: use max_new_tokens"),
    ("token_healing", lambda v: bool(v), "token healing is not supported: leave it unset"),
    ("constraints", lambda v: v is not None, "constrained beam search is not supported"),
    ("force_words_ids", lambda v: v is not None, "constrained beam search is not supported"),
    ("use_mtp", lambda v: bool(v), "multi-token prediction is not supported: pass a drafter instead"),
    ("assistant_ensemble_weight", lambda v: v is not None, "ensemble verification is lossy: leave it unset"),
    ("speculation_type", lambda v: v is not None, "transformers' own speculation types are not used here"),
    ("forced_decoder_ids", lambda v: bool(v), "use forced_bos_token_id, or put the tokens in the prompt"),
    ("generation_kwargs", lambda v: bool(v), "pass these as arguments to generate instead"),
)

# Fields that never change the tokens (cache, compile, output format, transformers' own drafting).
NO_TOKEN_EFFECT = frozenset(
    {
        "early_stopping", "use_cache", "cache_implementation", "cache_config", "max_cache_len", "output_attentions",
        "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate", "bos_token_id",
        "decoder_start_token_id", "is_assistant", "num_assistant_tokens", "num_assistant_tokens_schedule",
        "assistant_confidence_threshold", "prompt_lookup_num_tokens", "max_matching_ngram_size",
        "assistant_early_exit", "assistant_lookbehind", "target_lookbehind", "compile_config", "disable_compile",
        "continuous_batching_config", "low_memory", "prefill_chunk_size", "transformers_version",
        "return_legacy_cache",
    }
)  # fmt: skip

# Config names of a model's position limit; "max_seq_len" (MPT, DBRX) sizes a bias table indexed by key length.
POSITION_LIMIT_NAMES = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
KEY_LENGTH_LIMIT_NAMES = ("max_seq_len", "context_length")


@dataclass
class GenerationOptions:
    """What `generate` runs with, resolved once per call.

    input_ids [B, P] (user left padding included, as `model.generate` counts it); `user_pad` each row's
    leading masked positions; `attention_mask` the caller's or the inferred one (None: all attended);
    `config` the merged generation config.
    """

    config: GenerationConfig
    input_ids: torch.Tensor
    user_pad: list[int]  # per row
    max_new_tokens: int
    eos_ids: list[int] | None
    pad_id: int
    sampling: SamplingConfig
    attention_mask: torch.Tensor | None


def config_fields(fields: dict) -> dict:
    """`generate(**fields)`: GenerationConfig fields by name, as `model.generate(**kwargs)` takes them."""
    known = GenerationConfig().to_dict()
    for name in fields:
        if name.startswith("_") or name not in known:
            raise TypeError(f"generate() got an unexpected keyword argument {name!r} (not a GenerationConfig field)")
    return fields


def _check_explicit(do_sample, temperature, top_k, top_p, repetition_penalty, max_new_tokens=None) -> None:
    if max_new_tokens is not None and int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if do_sample and temperature is not None and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}; use do_sample=False for greedy")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if repetition_penalty is not None and repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")


def merged_config(
    model: PreTrainedModel, generation_config: GenerationConfig | None, explicit: dict
) -> GenerationConfig:
    """The generation config `model.generate(generation_config=..., **explicit)` would use."""
    explicit = {key: value for key, value in explicit.items() if value is not None}
    prepare = getattr(model, "_prepare_generation_config", None)
    if callable(prepare):  # transformers' own merge; explicit arguments go last, as its kwargs do
        config, _ = prepare(copy.deepcopy(generation_config) if generation_config is not None else None)
    else:
        config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
        own = getattr(model, "generation_config", None)
        if own is not None:
            config.update(**own.to_dict(), defaults_only=True)
    config.update(**explicit)
    return config


def refuse_unsupported(config: GenerationConfig | SimpleNamespace | None) -> None:
    """A ValueError naming the first field that changes tokens in a way this package cannot reproduce."""
    for name, active, advice in REFUSED:
        value = getattr(config, name, None)
        if active(value):
            raise ValueError(f"generation_config.{name}={value!r} is not supported: {advice}")


def _max_length_is_set(model: PreTrainedModel, generation_config: GenerationConfig | None) -> bool:
    """Whether a max_length was set by the caller's or the model's config (not transformers' default)."""
    default = GenerationConfig().max_length  # None on transformers 5.x, 20 on 4.x
    own = getattr(model, "generation_config", None)
    values = (getattr(generation_config, "max_length", None), getattr(own, "max_length", None))
    return any(value is not None and value != default for value in values)


def max_new_tokens_for(config: GenerationConfig, max_length_set: bool, prompt_length: int) -> int:
    """max_new_tokens, else max_length - prompt length (left padding counts, as in transformers)."""
    if config.max_new_tokens is not None:
        value = int(config.max_new_tokens)
        if value < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {value}")
        return value
    if not max_length_set:
        raise ValueError(
            "max_new_tokens is required (as an argument, or max_new_tokens / max_length in generation_config)"
        )
    value = int(config.max_length) - prompt_length
    if value < 1:
        raise ValueError(
            f"generation_config.max_length={config.max_length} leaves no room after the {prompt_length}-token prompt "
            "(padding included); raise max_length or set max_new_tokens"
        )
    return value


def validate_prompt(input_ids, attention_mask) -> tuple[torch.Tensor, list[int]]:
    """Return input_ids as [B, P] long and each row's number of left-padding positions."""
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
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids holds no rows (batch size 0): pass at least one prompt")
    if attention_mask is None:
        return input_ids.long(), [0] * input_ids.shape[0]
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor of 0s and 1s, got {type(attention_mask).__name__}")
    if attention_mask.dim() == 1:
        attention_mask = attention_mask[None, :]
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids {tuple(input_ids.shape)}; "
            "they must match"
        )
    mask = attention_mask.bool()
    pads = (~mask).long().cumprod(dim=1).sum(dim=1)  # [B] leading zeros
    columns = torch.arange(mask.shape[1])[None, :]
    if not bool((mask | (columns < pads[:, None])).all()):
        raise ValueError(
            "attention_mask must be left padding only (zeros, then ones in every row); got zeros after a one: "
            "tokenize with tokenizer.padding_side = 'left'"
        )
    if bool((pads == mask.shape[1]).any()):
        row = int((pads == mask.shape[1]).nonzero()[0, 0])
        raise ValueError(f"attention_mask masks every token of row {row}: each prompt needs at least one real token")
    return input_ids.long(), [int(pad) for pad in pads]


def inferred_attention_mask(input_ids: torch.Tensor, pad_id: int | None, eos_ids: list[int] | None):
    """transformers' rule: without a mask, pad tokens are masked when pad_token_id is set, occurs in the
    prompt and is not an EOS id; else None (everything attended)."""
    if pad_id is None or not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        return None
    if input_ids.dtype not in (torch.int, torch.long) or not bool((input_ids == pad_id).any()):
        return None
    if eos_ids is not None and pad_id in eos_ids:
        return None
    return input_ids.ne(pad_id).long()


def _inferred_left_padding(input_ids, pad_id: int | None, eos_ids: list[int] | None):
    """The inferred mask when it is left padding; a warning (and no mask) when it has holes."""
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 1:
        input_ids = input_ids[None]
    mask = inferred_attention_mask(input_ids, pad_id, eos_ids)
    if mask is None:
        return mask
    real = mask.bool()
    lead = (~real).long().cumprod(dim=1).sum(dim=1)  # [B]
    columns = torch.arange(real.shape[1])[None, :]
    if bool((real | (columns < lead[:, None])).all()) and bool((lead < real.shape[1]).all()):
        return mask
    warnings.warn(
        f"input_ids holds pad_token_id={pad_id} after its first real token (or only pad tokens): model.generate "
        "would mask those positions out, which this package cannot do; every position is attended. Pass "
        "attention_mask explicitly to silence this (ones to attend to them)",
        UserWarning,
        stacklevel=3,
    )
    return None


def _special_tokens(
    model: PreTrainedModel, config: GenerationConfig, has_mask: bool, device: torch.device
) -> tuple[list | None, int | None]:
    """(eos ids, pad id) as `model.generate` resolves them (pad falls back to the first EOS); sets the
    config's special-token tensors on `device` as transformers' processors expect."""
    prepare = getattr(model, "_prepare_special_tokens", None)
    if callable(prepare):
        batch = {"batch_size": 1} if "batch_size" in inspect.signature(prepare).parameters else {}  # 5.x: no warning
        prepare(config, kwargs_has_attention_mask=has_mask, device=device, **batch)
        eos, pad = config._eos_token_tensor, config._pad_token_tensor
        eos_ids = [int(v) for v in eos.flatten().tolist()] if eos is not None else None
        return eos_ids, (int(pad) if pad is not None else None)
    eos = config.eos_token_id
    eos_ids = None if eos is None else [int(v) for v in (eos if isinstance(eos, (list, tuple)) else [eos])]
    pad = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else None)
    return eos_ids, pad


def logits_processors(
    model: PreTrainedModel, options: GenerationOptions, attention_mask, device: torch.device
) -> list[LogitsProcessor]:
    """The processors (and, when sampling, warpers) `model.generate` builds for this call, in its order,
    with their tensors on `device`."""
    return _built_processors(model, options.config, options.input_ids, attention_mask, device)


def row_logits_processors(
    model: PreTrainedModel, options: GenerationOptions, device: torch.device
) -> list[list[LogitsProcessor]]:
    """Batches: for each row, the processors `model.generate` builds for that row's prompt alone
    (without its padding: lengths such as min_new_tokens count from its own prompt)."""
    lists = []
    for row, pad in enumerate(options.user_pad):
        prompt = options.input_ids[row : row + 1, pad:]
        config = copy.copy(options.config)
        config.max_length = prompt.shape[1] + options.max_new_tokens
        if config.min_new_tokens is not None:
            config.min_length = config.min_new_tokens + prompt.shape[1]
        lists.append(_built_processors(model, config, prompt, None, device))
    return lists


def _built_processors(
    model: PreTrainedModel, config: GenerationConfig, input_ids: torch.Tensor, attention_mask, device: torch.device
) -> list[LogitsProcessor]:
    build = getattr(model, "_get_logits_processor", None)
    if not callable(build):
        raise NotImplementedError(f"{type(model).__name__} has no _get_logits_processor: it is not a generation model")
    config = copy.copy(config)
    _special_tokens(model, config, attention_mask is not None, device)
    input_ids = input_ids.to(device)
    mask = attention_mask.reshape(input_ids.shape).to(device) if attention_mask is not None else None
    kwargs = {"attention_mask": mask} if mask is not None else {}
    processors = build(
        generation_config=config,
        input_ids_seq_length=input_ids.shape[1],
        encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=None,
        logits_processor=LogitsProcessorList(),
        device=device,
        model_kwargs=kwargs,
    )
    return list(processors)


def resolve(
    model: PreTrainedModel,
    input_ids,
    attention_mask,
    generation_config: GenerationConfig | None,
    explicit: dict,
) -> GenerationOptions:
    """Merge the configs, refuse what cannot be honoured, infer the mask, resolve lengths and special tokens."""
    _check_explicit(
        explicit.get("do_sample"), explicit.get("temperature"), explicit.get("top_k"), explicit.get("top_p"),
        explicit.get("repetition_penalty"), explicit.get("max_new_tokens"),
    )  # fmt: skip
    for given in (generation_config, SimpleNamespace(**explicit)):  # before transformers' own validation
        refuse_unsupported(given)
    config = merged_config(model, generation_config, explicit)
    if isinstance(config.eos_token_id, (list, tuple)) and not config.eos_token_id:
        config.eos_token_id = None  # eos_token_id=[]: no EOS at all (not the model's)
    refuse_unsupported(config)
    do_sample = bool(config.do_sample)
    temperature = 1.0 if config.temperature is None else float(config.temperature)
    _check_explicit(do_sample, temperature, config.top_k, config.top_p, config.repetition_penalty)
    eos_ids, pad_id = _special_tokens(model, config, attention_mask is not None, torch.device("cpu"))
    if attention_mask is None:
        attention_mask = _inferred_left_padding(input_ids, pad_id, eos_ids)
    input_ids, user_pad = validate_prompt(input_ids, attention_mask)
    prompt_length = input_ids.shape[1]
    max_new_tokens = max_new_tokens_for(config, _max_length_is_set(model, generation_config), prompt_length)
    config.max_length = prompt_length + max_new_tokens  # what ForcedEOS and the length checks see
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_length
    sampling = SamplingConfig(do_sample, temperature, config.top_k or None, config.top_p, config.repetition_penalty)
    return GenerationOptions(
        config=config,
        input_ids=input_ids,
        user_pad=user_pad,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        pad_id=pad_id if pad_id is not None else 0,
        sampling=sampling,
        attention_mask=attention_mask,
    )


def position_limits(model: PreTrainedModel) -> tuple[int | None, tuple[str, int] | None]:
    """(positions limit, (name, key-length limit)) from the model's config, either None when not stated."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    positions = hf_compat.max_positions(model)
    if positions is None:
        positions = next((v for n in POSITION_LIMIT_NAMES if isinstance(v := getattr(config, n, None), int)), None)
    keys = next(
        ((n, v) for n in KEY_LENGTH_LIMIT_NAMES if isinstance(v := getattr(config, n, None), int) and v > 0), None
    )
    return positions, keys


def check_length(model: PreTrainedModel, role: str, real_prompt: int, max_new_tokens: int, cache_length: int) -> None:
    """Refuse before generating when the positions or the cache (`cache_length` keys, padding included)
    exceed what the model's config allows."""
    positions, keys = position_limits(model)
    needed = real_prompt + max_new_tokens
    if positions is not None and needed > positions:
        raise ValueError(
            f"prompt ({real_prompt} tokens) + max_new_tokens ({max_new_tokens}) = {needed} exceeds the {role}'s "
            f"{positions} positions; shorten the prompt or lower max_new_tokens"
        )
    if keys is not None and cache_length > keys[1]:
        raise ValueError(
            f"the {role} would attend over {cache_length} cached positions (prompt with padding + max_new_tokens, "
            f"the whole preallocated cache under the static layout) but its config's {keys[0]} is {keys[1]}; "
            "shorten the prompt or lower max_new_tokens"
        )

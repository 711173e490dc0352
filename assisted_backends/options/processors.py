"""The logits processors `model.generate` would build for a call, built by transformers itself.

`_get_logits_processor` gets the merged config and the caller's own `logits_processor` list (a
caller's processor of a type transformers also builds replaces it, as in `model.generate`), so p and q
are exactly the distributions plain decoding uses. Processors must be functions of the ids and scores
they are given (transformers' are): the loop asks them at every verified position of a round, also at
positions whose tokens are later rejected.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.logits_process import LogitsProcessor, LogitsProcessorList

from assisted_backends.options.errors import refusal
from assisted_backends.options.request import GenerationOptions


def special_tokens(
    model: PreTrainedModel, config: GenerationConfig, has_mask: bool, device: torch.device
) -> tuple[list[int] | None, int | None]:
    """(eos ids, pad id) as `model.generate` resolves them (pad falls back to the first EOS; `[]`: no EOS);
    sets the config's special-token tensors on `device` as transformers' processors expect."""
    prepare = getattr(model, "_prepare_special_tokens", None)
    eos = config.eos_token_id
    if isinstance(eos, (list, tuple)) and not eos and config.pad_token_id is None:
        raise refusal("eos_no_pad", eos=("eos_token_id", []), pad="pad_token_id")
    if callable(prepare):
        batch = {"batch_size": 1} if "batch_size" in inspect.signature(prepare).parameters else {}  # 5.x: no warning
        prepare(config, kwargs_has_attention_mask=has_mask, device=device, **batch)
        eos_tensor, pad = config._eos_token_tensor, config._pad_token_tensor
        eos_ids = [int(v) for v in eos_tensor.flatten().tolist()] if eos_tensor is not None else None
        return eos_ids, (int(pad) if pad is not None else None)
    eos_ids = None if eos is None else [int(v) for v in (eos if isinstance(eos, (list, tuple)) else [eos])]
    pad = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else None)
    return eos_ids, pad


def _own_state(processor: LogitsProcessor) -> LogitsProcessor:
    """A caller's processor that keeps state per sequence (`structured.GrammarProcessor`: `for_new_sequence`) starts
    anew in each list built here: one per call, per batch row and per queued prompt."""
    fresh = getattr(processor, "for_new_sequence", None)
    return fresh() if callable(fresh) else processor


def logits_processors(
    model: PreTrainedModel, options: GenerationOptions, device: torch.device
) -> list[LogitsProcessor]:
    """The processors (and, when sampling, warpers) `model.generate` builds for the call of `options` (its prompt
    [B, P], mask, merged config, the caller's `logits_processor=` list and prefix function), in its order, with
    their tensors on `device`."""
    build = getattr(model, "_get_logits_processor", None)
    if not callable(build):
        raise refusal("not_generation_model", {"model": type(model).__name__, "method": "_get_logits_processor"},
                      name="model")  # fmt: skip
    config = copy.copy(options.config)
    special_tokens(model, config, options.attention_mask is not None, device)
    input_ids = options.input_ids.to(device)
    mask = options.attention_mask
    mask = mask.reshape(input_ids.shape).to(device) if mask is not None else None
    processors = build(
        generation_config=config,
        input_ids_seq_length=input_ids.shape[1],
        encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=options.prefix_allowed_tokens_fn,
        logits_processor=LogitsProcessorList([_own_state(p) for p in options.custom_processors]),
        device=device,
        model_kwargs={"attention_mask": mask} if mask is not None else {},
    )
    return list(processors)


def row_logits_processors(
    model: PreTrainedModel,
    options: GenerationOptions,
    input_ids: torch.Tensor,
    user_pad: list[int],
    device: torch.device,
) -> list[list[LogitsProcessor]]:
    """Batches: for each row of `input_ids` [B, P] (`user_pad` its left padding), the processors `model.generate`
    builds for that row's prompt alone, with the config and processors of `options` (without its padding: lengths
    such as min_new_tokens count from its own prompt)."""
    lists = []
    for row, pad in enumerate(user_pad):
        prompt = input_ids[row : row + 1, pad:]
        config = copy.copy(options.config)
        config.max_length = prompt.shape[1] + options.config_limit
        if config.min_new_tokens is not None:
            config.min_length = config.min_new_tokens + prompt.shape[1]
        alone = dataclasses.replace(
            options, config=config, input_ids=prompt, attention_mask=None, prefix_allowed_tokens_fn=None
        )
        lists.append(logits_processors(model, alone, device))
    return lists

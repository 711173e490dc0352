"""The logits processors `model.generate` would build for a call, built by transformers itself.

`_get_logits_processor` gets the merged config and the caller's own `logits_processor` list (a
caller's processor of a type transformers also builds replaces it, as in `model.generate`), so p and q
are exactly the distributions plain decoding uses. Processors must be functions of the ids and scores
they are given (transformers' are): the loop asks them at every verified position of a round, also at
positions whose tokens are later rejected.
"""

from __future__ import annotations

import copy
import inspect

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.logits_process import LogitsProcessor, LogitsProcessorList

from assisted_backends.options.errors import refusal


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


def logits_processors(
    model: PreTrainedModel,
    config: GenerationConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    device: torch.device,
    custom: list[LogitsProcessor] = (),
    prefix_allowed_tokens_fn=None,
) -> list[LogitsProcessor]:
    """The processors (and, when sampling, warpers) `model.generate` builds for `input_ids` [B, P], in its
    order, with their tensors on `device`; `custom`: the caller's `logits_processor=` list."""
    build = getattr(model, "_get_logits_processor", None)
    if not callable(build):
        raise refusal("not_generation_model", {"model": type(model).__name__, "method": "_get_logits_processor"},
                      name="model")  # fmt: skip
    config = copy.copy(config)
    special_tokens(model, config, attention_mask is not None, device)
    input_ids = input_ids.to(device)
    mask = attention_mask.reshape(input_ids.shape).to(device) if attention_mask is not None else None
    processors = build(
        generation_config=config,
        input_ids_seq_length=input_ids.shape[1],
        encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
        logits_processor=LogitsProcessorList(custom),
        device=device,
        model_kwargs={"attention_mask": mask} if mask is not None else {},
    )
    return list(processors)


def row_logits_processors(
    model: PreTrainedModel,
    config: GenerationConfig,
    input_ids: torch.Tensor,
    user_pad: list[int],
    max_new_tokens: int,
    device: torch.device,
    custom: list[LogitsProcessor] = (),
) -> list[list[LogitsProcessor]]:
    """Batches: for each row, the processors `model.generate` builds for that row's prompt alone (without its
    padding: lengths such as min_new_tokens count from its own prompt)."""
    lists = []
    for row, pad in enumerate(user_pad):
        prompt = input_ids[row : row + 1, pad:]
        row_config = copy.copy(config)
        row_config.max_length = prompt.shape[1] + max_new_tokens
        if row_config.min_new_tokens is not None:
            row_config.min_length = row_config.min_new_tokens + prompt.shape[1]
        lists.append(logits_processors(model, row_config, prompt, None, device, custom))
    return lists

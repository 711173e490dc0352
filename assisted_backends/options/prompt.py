"""The prompt as `model.generate` reads it: ids, attention mask, left padding, the BOS start.

Without these checks a token id past the vocabulary would surface as an IndexError deep inside the
embedding and a mask with holes would be attended silently; each gets one line naming the argument.
"""

from __future__ import annotations

import warnings

import torch

from assisted_backends.options.errors import OptionError, OptionTypeError

IDS, MASK = "input_ids", "attention_mask"


def start_ids(input_ids, bos_token_id, batch_size: int = 1) -> torch.Tensor:
    """`input_ids`, or, when it is None, one BOS token per row (what `model.generate` starts from)."""
    if input_ids is not None:
        return input_ids
    if bos_token_id is None:
        raise OptionError(
            "{name} is missing and the model's generation config has no bos_token_id to start from; pass a prompt",
            name="input_ids",
        )
    first = bos_token_id[0] if isinstance(bos_token_id, (list, tuple)) else bos_token_id
    return torch.full((batch_size, 1), int(first), dtype=torch.long)


def check_token_ids(input_ids, vocabulary: int | None) -> None:
    """OptionTypeError for non-integer ids; OptionError naming the first id outside [0, vocabulary)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.numel() == 0:
        return  # `validate_prompt` names those errors
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise OptionTypeError(f"{{name}} must hold integer token ids (torch.long), got {input_ids.dtype}", name=IDS)
    if vocabulary is None:
        return
    low, high = (int(v) for v in torch.stack([input_ids.min(), input_ids.max()]).tolist())
    if low >= 0 and high < vocabulary:
        return
    bad = ((input_ids < 0) | (input_ids >= vocabulary)).flatten().nonzero()[0, 0].item()
    token = int(input_ids.flatten()[bad])
    raise OptionError(
        f"{{name}} holds token id {token} (at flat position {bad}), outside the target's vocabulary "
        f"[0, {vocabulary}); encode the prompt with the target model's own tokenizer",
        name=IDS,
    )


def validate_prompt(input_ids, attention_mask) -> tuple[torch.Tensor, list[int]]:
    """Return input_ids as [B, P] long and each row's number of left-padding positions."""
    if not isinstance(input_ids, torch.Tensor):
        raise OptionTypeError(
            f"{{name}} must be a torch.LongTensor of shape [batch, length], got {type(input_ids).__name__}", name=IDS
        )
    if input_ids.dim() == 1:
        input_ids = input_ids[None, :]
    if input_ids.dim() != 2:
        raise OptionError(f"{{name}} must have shape [batch, length], got {tuple(input_ids.shape)}", name=IDS)
    if input_ids.shape[1] == 0:
        raise OptionError("{name} is empty: the prompt needs at least one token (add a BOS token for an empty text)",
                          name=IDS)  # fmt: skip
    if input_ids.shape[0] == 0:
        raise OptionError("{name} holds no rows (batch size 0): pass at least one prompt", name=IDS)
    if attention_mask is None:
        return input_ids.long(), [0] * input_ids.shape[0]
    if not isinstance(attention_mask, torch.Tensor):
        raise OptionTypeError(
            f"{{name}} must be a torch.Tensor of 0s and 1s, got {type(attention_mask).__name__}", name=MASK
        )
    if attention_mask.dim() == 1:
        attention_mask = attention_mask[None, :]
    if attention_mask.shape != input_ids.shape:
        raise OptionError(
            f"{{name}} has shape {tuple(attention_mask.shape)} but input_ids {tuple(input_ids.shape)}; they must match",
            name=MASK,
        )
    mask = attention_mask.bool()
    pads = (~mask).long().cumprod(dim=1).sum(dim=1)  # [B] leading zeros
    columns = torch.arange(mask.shape[1])[None, :]
    if not bool((mask | (columns < pads[:, None])).all()):
        raise OptionError(
            "{name} must be left padding only (zeros, then ones in every row); got zeros after a one: "
            "tokenize with tokenizer.padding_side = 'left' (right padding is not served: a rolled-back cache "
            "keeps every row's tokens contiguous)",
            name=MASK,
        )
    if bool((pads == mask.shape[1]).any()):
        row = int((pads == mask.shape[1]).nonzero()[0, 0])
        raise OptionError(f"{{name}} masks every token of row {row}: each prompt needs at least one real token",
                          name=MASK)  # fmt: skip
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


def inferred_left_padding(input_ids, pad_id: int | None, eos_ids: list[int] | None):
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

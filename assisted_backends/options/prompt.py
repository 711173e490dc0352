"""The prompt as `model.generate` reads it: ids, attention mask, left padding, the BOS start.

Without these checks a token id past the vocabulary would surface as an IndexError deep inside the
embedding; each gets one line naming the argument. Masks with holes (right padding, pad tokens inside a
prompt) are served as `model.generate` serves them: the masked columns are never attended. A mask inferred from
the pad id (none passed) is applied as transformers applies it, a row it masks whole included; only a mask the
caller passed is refused for leaving a row no token (`check_mask`).
"""

from __future__ import annotations

import torch

from assisted_backends.options.errors import refusal

IDS, MASK = "input_ids", "attention_mask"


def start_ids(input_ids, bos_token_id, batch_size: int = 1) -> torch.Tensor:
    """`input_ids`, or, when it is None, one BOS token per row (what `model.generate` starts from)."""
    if input_ids is not None:
        return input_ids
    if bos_token_id is None:
        raise refusal("prompt_missing", name=IDS)
    first = bos_token_id[0] if isinstance(bos_token_id, (list, tuple)) else bos_token_id
    return torch.full((batch_size, 1), int(first), dtype=torch.long)


def check_token_ids(input_ids, vocabulary: int | None) -> None:
    """OptionTypeError for non-integer ids; OptionError naming the first id outside [0, vocabulary)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.numel() == 0:
        return  # `validate_prompt` names those errors
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise refusal("prompt_dtype", {"dtype": input_ids.dtype}, name=IDS)
    if vocabulary is None:
        return
    low, high = (int(v) for v in torch.stack([input_ids.min(), input_ids.max()]).tolist())
    if low >= 0 and high < vocabulary:
        return
    bad = ((input_ids < 0) | (input_ids >= vocabulary)).flatten().nonzero()[0, 0].item()
    token = int(input_ids.flatten()[bad])
    raise refusal("prompt_vocabulary", {"token": token, "position": bad, "vocabulary": vocabulary}, name=IDS)


def validate_prompt(input_ids) -> torch.Tensor:
    """input_ids as [B, P] long (a 1-D prompt is one row)."""
    if not isinstance(input_ids, torch.Tensor):
        raise refusal("prompt_type", {"found": type(input_ids).__name__}, name=IDS)
    if input_ids.dim() == 1:
        input_ids = input_ids[None, :]
    if input_ids.dim() != 2:
        raise refusal("prompt_shape", {"shape": tuple(input_ids.shape)}, name=IDS)
    if input_ids.shape[1] == 0:
        raise refusal("prompt_empty", name=IDS)
    if input_ids.shape[0] == 0:
        raise refusal("prompt_no_rows", name=IDS)
    return input_ids.long()


def check_mask(attention_mask, input_ids: torch.Tensor) -> None:
    """The caller's mask: a tensor of `input_ids`' [B, P] (or [P] for one row) that leaves every row a token."""
    if not isinstance(attention_mask, torch.Tensor):
        raise refusal("mask_type", {"found": type(attention_mask).__name__}, name=MASK)
    if attention_mask.dim() == 1:
        attention_mask = attention_mask[None, :]
    if attention_mask.shape != input_ids.shape:
        shapes = {"shape": tuple(attention_mask.shape), "ids_shape": tuple(input_ids.shape)}
        raise refusal("mask_shape", shapes, name=MASK)
    empty = ~attention_mask.bool().any(dim=1)
    if bool(empty.any()):
        raise refusal("mask_empty_row", {"row": int(empty.nonzero()[0, 0])}, name=MASK)


def left_padding(attention_mask: torch.Tensor | None, rows: int) -> list[int]:
    """Each row's left padding: its leading masked columns (masked columns after a row's first token, right
    padding included, are holes: `has_holes`). A row masked whole, which only a mask transformers inferred leaves
    (`check_mask` refuses a caller's), has none: its columns are holes, applied as `model.generate` applies them."""
    if attention_mask is None:
        return [0] * rows
    mask = attention_mask.reshape(rows, -1).bool()
    pads = (~mask).long().cumprod(dim=1).sum(dim=1)  # [B] leading zeros
    return [0 if int(pad) == mask.shape[1] else int(pad) for pad in pads]


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


def has_holes(attention_mask: torch.Tensor | None, pads: list[int]) -> bool:
    """Whether the mask masks a column after some row's first attended one (right padding, pad tokens inside)."""
    if attention_mask is None:
        return False
    mask = attention_mask.reshape(len(pads), -1).bool()
    columns = torch.arange(mask.shape[1])[None, :]
    return not bool((mask | (columns < torch.tensor(pads)[:, None])).all())


def positions_from_mask(attention_mask: torch.Tensor, masked_value: int) -> torch.Tensor:
    """[B, P] the position ids `model.generate` derives from a mask: attended columns count 0, 1, 2, ...;
    masked columns get `masked_value` (`hf_compat.MASKED_POSITION_ID`)."""
    mask = attention_mask.long()
    return (mask.cumsum(dim=-1) - 1).masked_fill(mask == 0, masked_value)

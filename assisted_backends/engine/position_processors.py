"""Prefix-dependent logits processors applied to the q verified positions of a pass at once.

A pass scores positions j = 0..q − 1; position j was computed after the prefix `context[:, start : e_j]`,
e_j = L − (q − 1 − j) (`engine.sampling`). Calling a processor once per position with its own prefix is exact for any
processor, and costs a copy of the full-vocabulary row and the processor's own full-vocabulary work per position
(transformers' `MinNewTokensLengthLogitsProcessor` rebuilds `isin(arange(V), eos)` at every call: 3 ms per position
on a 262k vocabulary). The processors whose position dependence is known run here instead, on all positions in one
step, writing into one copy of the logits made only when something changes:

- EOS below a minimum length (`MinNewTokensLengthLogitsProcessor`, `MinLengthLogitsProcessor`): the EOS columns of
  the positions whose prefix is still too short are set to −inf; nothing at all once the minimum is reached.
- Penalties that are a function of each token's count in the prefix (`CountPenalty`: transformers'
  `RepetitionPenaltyLogitsProcessor`, `options.penalties.OpenAIPenaltiesLogitsProcessor`): the scores of the
  distinct tokens the last position's prefix holds are gathered ([q, U] per row), changed by the same elementwise
  formula from their count at each position, and written back; every other score is left as the processor leaves
  it.

Each result equals what the processor gives called at that position with that prefix, bit for bit but for the sign
of a zero the processor's own arithmetic may flip on untouched tokens (the tests hold it to that, with
`torch.equal`). Any other processor, a subclass, or ids outside the vocabulary keeps the call per position.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers.generation.logits_process import (
    LogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)


@runtime_checkable
class CountPenalty(Protocol):
    """A processor whose change to the score of token t depends only on s_t and c_t, the count of t in
    `input_ids[:, counted_from:]`, leaving tokens with c_t = 0 as they are (up to the sign of a zero)."""

    counted_from: int

    def from_counts(self, scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The processed scores for `scores` and the counts `counts` (same shape, the scores' dtype)."""


@dataclass(frozen=True)
class _RepetitionByCounts:
    """transformers' repetition penalty as a `CountPenalty` (its own formula: a seen token's score multiplied by the
    penalty where negative, divided by it otherwise)."""

    penalty: float
    counted_from: int

    def from_counts(self, scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        penalized = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return torch.where(counts > 0, penalized, scores)


class _Scores:
    """The scores being processed: the logits themselves until a processor changes something, then one copy; which
    EOS columns are already −inf on how many leading positions (a minimum length and a minimum of new tokens mask
    the same columns: the second costs nothing)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.tensor, self.copied = logits, False
        self.eos_masked: dict[tuple[int, ...], int] = {}

    def writable(self) -> torch.Tensor:
        if not self.copied:
            self.tensor, self.copied = self.tensor.clone(), True
        return self.tensor

    def replace(self, tensor: torch.Tensor) -> None:
        self.tensor, self.copied = tensor, True
        self.eos_masked = {}


@dataclass(frozen=True)
class _Positions:
    """The q positions of one pass: position j's prefix is `context[:, start : first_end + j]`."""

    context: torch.Tensor  # [B, L]
    start: int
    count: int  # q

    @property
    def first_end(self) -> int:
        return self.context.shape[1] - (self.count - 1)

    def prefix(self, j: int) -> torch.Tensor:
        return self.context[:, self.start : self.first_end + j]


def _masked_below(length: int, positions: _Positions) -> int:
    """How many leading positions have a prefix shorter than `length` (their prefix lengths: first_end − start + j)."""
    return min(max(length - (positions.first_end - positions.start), 0), positions.count)


# per EOS tensor of a processor: (vocabulary size, device) -> (its ids inside the vocabulary, as a key and a tensor)
_EOS_COLUMNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _eos_columns(processor: LogitsProcessor, vocab: int, device: torch.device) -> tuple[tuple[int, ...], torch.Tensor]:
    """The processor's EOS ids inside [0, V) (`isin(arange(V), eos)` ignores the others), read once per processor."""
    known = _EOS_COLUMNS.get(processor)
    if known is not None and known[0] == (vocab, device):
        return known[1]
    ids = tuple(sorted({int(e) for e in processor.eos_token_id.reshape(-1).tolist() if 0 <= int(e) < vocab}))
    columns = (ids, torch.tensor(ids, dtype=torch.long, device=device))
    _EOS_COLUMNS[processor] = ((vocab, device), columns)
    return columns


def _eos_below_length(processor: LogitsProcessor, leading: int, scores: _Scores) -> bool:
    """The EOS columns of the first `leading` positions set to −inf (what `torch.where(isin(arange(V), eos), −inf,
    s)` gives)."""
    if leading == 0:
        return True
    key, columns = _eos_columns(processor, scores.tensor.shape[-1], scores.tensor.device)
    if not key or scores.eos_masked.get(key, 0) >= leading:
        return True
    tensor = scores.writable()
    (tensor if leading == tensor.shape[1] else tensor[:, :leading]).index_fill_(-1, columns, -math.inf)
    scores.eos_masked[key] = leading
    return True


def _min_new_tokens(processor: MinNewTokensLengthLogitsProcessor, positions: _Positions, scores: _Scores) -> bool:
    length = processor.prompt_length_to_skip + processor.min_new_tokens
    return _eos_below_length(processor, _masked_below(length, positions), scores)


def _min_length(processor: MinLengthLogitsProcessor, positions: _Positions, scores: _Scores) -> bool:
    return _eos_below_length(processor, _masked_below(processor.min_length, positions), scores)


def _token_counts(
    positions: _Positions, row: int, counted_from: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(tokens [U], counts [q, U]): the distinct tokens of row `row`'s counted prefix at the last position,
    `context[row, start + counted_from : L]`, and each one's count in position j's counted prefix; None when an id
    lies outside [0, V). Work over those ids only, never over the vocabulary, in few calls (after the native step
    has streamed the weights through the caches, each torch call costs 10-20 µs whatever its size)."""
    context, q, first_end = positions.context, positions.count, positions.first_end
    begin = positions.start + counted_from
    ids = context[row, begin:]
    if ids.numel() == 0:
        return ids, ids[None].expand(q, 0)
    base_end = max(first_end, begin)  # columns [begin, base_end) are in every position's prefix
    extras = context.shape[1] - base_end
    if extras == 0:  # one position (a plain step or the prompt pass)
        tokens, counts = torch.unique(ids, return_counts=True)
    else:
        tokens, inverse = torch.unique(ids, return_inverse=True)
    if int(tokens[0]) < 0 or int(tokens[-1]) >= vocab:  # sorted
        return None
    if extras == 0:
        return tokens, counts[None]
    base = torch.bincount(inverse[: base_end - begin], minlength=tokens.numel())  # [U]
    arange = torch.arange(tokens.numel(), device=ids.device)
    through = (inverse[base_end - begin :, None] == arange[None]).cumsum(0)  # [k, U]: extras 0..k' counted
    through = torch.cat([torch.zeros_like(through[:1]), through])  # row m: the first m extras
    # extra k' (column base_end + k') is in position j's prefix when base_end + k' < first_end + j
    held = (torch.arange(q, device=ids.device) - (base_end - first_end)).clamp(0, extras)  # [q]
    return tokens, base[None] + through[held]


def _count_penalty(penalty: CountPenalty, positions: _Positions, scores: _Scores) -> bool:
    """`penalty` on the distinct tokens each row's prefixes hold (gathered [q, U], changed, written back)."""
    vocab = scores.tensor.shape[-1]
    found = [_token_counts(positions, row, penalty.counted_from, vocab) for row in range(positions.context.shape[0])]
    if any(counted is None for counted in found):
        return False
    for row, (tokens, counts) in enumerate(found):
        if tokens.numel() == 0:
            continue
        tensor = scores.writable()
        if tensor.shape[0] == 1 and counts.shape[0] == 1:  # one row, one position: the flat row
            flat = tensor.view(-1)
            flat[tokens] = penalty.from_counts(flat[tokens], counts[0].to(flat.dtype))
        else:
            scores_row = tensor[row]  # [q, V]
            scores_row[:, tokens] = penalty.from_counts(scores_row[:, tokens], counts.to(scores_row.dtype))
    return True


def _repetition(processor: RepetitionPenaltyLogitsProcessor, positions: _Positions, scores: _Scores) -> bool:
    ignored = getattr(processor, "prompt_ignore_length", None)  # transformers < 4.56 has none: nothing ignored
    if ignored is not None and not isinstance(ignored, int):
        return False  # per-row lengths (a tensor): per position
    return _count_penalty(_RepetitionByCounts(processor.penalty, ignored or 0), positions, scores)


AtOnce = Callable[[LogitsProcessor, _Positions, _Scores], bool]
_AT_ONCE: dict[type, AtOnce] = {
    MinNewTokensLengthLogitsProcessor: _min_new_tokens,
    MinLengthLogitsProcessor: _min_length,
    RepetitionPenaltyLogitsProcessor: _repetition,
}


def _at_once(processor: LogitsProcessor) -> AtOnce | None:
    """How `processor` runs on all positions at once (exact types only: a subclass may change what it does)."""
    known = _AT_ONCE.get(type(processor))
    if known is not None:
        return known
    if isinstance(processor, CountPenalty) and _counts_decide(type(processor)):
        return _count_penalty
    return None


def _counts_decide(kind: type) -> bool:
    """Whether the class that defines `kind`'s `__call__` also defines its `from_counts` (a subclass overriding one
    of them alone may no longer be a function of the counts)."""
    caller = next(c for c in kind.__mro__ if "__call__" in vars(c))
    return "from_counts" in vars(caller)


def _per_position(processors: list[LogitsProcessor], positions: _Positions, scores: _Scores) -> None:
    """`processors` called at each position with its own prefix (any processor: some write in place)."""
    rows = []
    for j in range(positions.count):  # γ + 1 positions at most
        row = scores.tensor[:, j].clone()
        for processor in processors:
            row = processor(positions.prefix(j), row)
        rows.append(row)
    scores.replace(torch.stack(rows, dim=1))


def process_positions(
    processors: list[LogitsProcessor], context: torch.Tensor, start: int, logits: torch.Tensor
) -> torch.Tensor:
    """Scores [B, q, V] of `logits` [B, q, V] after `processors` in order, position j's prefix being
    `context[:, start : L − (q − 1 − j)]`; `logits` itself when no processor changes anything."""
    positions, scores = _Positions(context, start, logits.shape[1]), _Scores(logits)
    waiting: list[LogitsProcessor] = []  # consecutive processors that run per position, in order
    for processor in processors:
        at_once = _at_once(processor)
        if at_once is not None and waiting:
            _per_position(waiting, positions, scores)
            waiting = []
        if at_once is None or not at_once(processor, positions, scores):
            waiting.append(processor)
    if waiting:
        _per_position(waiting, positions, scores)
    return scores.tensor

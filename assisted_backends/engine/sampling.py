"""Turning logits into the distribution plain decoding would sample from.

`TokenSelector` applies transformers' own logits processors: the list `model.generate` builds for
the same call (`options.resolve`), or, from a bare `SamplingConfig`, repetition penalty then
temperature, top-k, top-p. So the target's p and the draft's q are exactly the distributions plain
sampling would draw from (docs/design.md rule 2). Prefix-dependent processors see, at verify position j,
the prefix extended by the earlier draft tokens of the same round, without the bucket padding
static shapes insert (`offset`), so the ids and lengths they see are those `model.generate` sees; the known
ones (minimum lengths, repetition and count penalties) run on all positions at once, the others once per position
(`engine.position_processors`). Processors that act on each row alone run once on all positions together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.generation import logits_process
from transformers.generation.logits_process import (
    LogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from assisted_backends.engine.position_processors import process_positions
from assisted_backends.engine.slots import RowStarts, Slots


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from the logits: greedy argmax, or sampling after warping."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None


# Processors whose output row depends on that row of scores only (no prefix, no per-batch state).
_ROW_WISE_NAMES = (
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
    "EpsilonLogitsWarper", "EtaLogitsWarper", "TopHLogitsWarper", "SuppressTokensLogitsProcessor",
    "InfNanRemoveLogitsProcessor", "LogitNormalization",
)  # fmt: skip
ROW_WISE = tuple(c for c in (getattr(logits_process, n, None) for n in _ROW_WISE_NAMES) if c is not None)


def _split(processors: list[LogitsProcessor]) -> tuple[list[LogitsProcessor], list[LogitsProcessor]]:
    """(prefix-dependent head, row-wise tail): the longest tail of row-wise processors runs batched;
    everything before it runs per position."""
    split = len(processors)
    while split > 0 and isinstance(processors[split - 1], ROW_WISE):
        split -= 1
    return processors[:split], processors[split:]


def _config_processors(config: SamplingConfig) -> list[LogitsProcessor]:
    processors: list[LogitsProcessor] = []
    if config.repetition_penalty not in (None, 1.0):
        processors.append(RepetitionPenaltyLogitsProcessor(float(config.repetition_penalty)))
    if config.do_sample:
        if config.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k:
            processors.append(TopKLogitsWarper(config.top_k))
        if config.top_p is not None and config.top_p < 1.0:
            processors.append(TopPLogitsWarper(config.top_p))
    return processors


class TokenSelector:
    """Processes logits [B, q, V] into scores, probabilities, and chosen tokens.

    `processors`: transformers' processors in `model.generate`'s order (default: built from
    `config`); `offset`: leading positions of every context that `model.generate` would not see
    (static-shape bucket padding). Batches: `row_processors[r]` are those built for row r's prompt
    alone; the prefix-dependent ones run on each row's own prefix (`RowStarts`).
    """

    def __init__(
        self,
        config: SamplingConfig,
        processors: list[LogitsProcessor] | None = None,
        offset: int = 0,
        row_processors: list[list[LogitsProcessor]] | None = None,
    ) -> None:
        self.config = config
        self.offset = offset
        if row_processors:
            processors = row_processors[0]
        processors = _config_processors(config) if processors is None else list(processors)
        self._prefix_processors, self._warpers = _split(processors)
        self._row_prefix_processors: dict[int, list[LogitsProcessor]] | None = None
        for row, own in enumerate(row_processors or ()):
            self.add_row(row, own)

    def add_row(self, row: int, processors: list[LogitsProcessor]) -> None:
        """The caller's row `row` (a prompt joining a queue's batch) is processed by `processors`, those
        `model.generate` builds for its prompt alone (the same row-wise warpers as every row: one config)."""
        if self._row_prefix_processors is None:
            self._row_prefix_processors = {}
        self._row_prefix_processors[row] = _split(list(processors))[0]

    def drop_row(self, row: int) -> None:
        """The caller's row `row` finished: its processors are no longer needed."""
        if self._row_prefix_processors is not None:
            self._row_prefix_processors.pop(row, None)

    def allowed_drafts(self, slots: Slots, start: int, count: int) -> int:
        """How many of the `count` drafts at columns [start, start + count) verification may accept: a draft that a
        row's prefix processor forbids (`DraftCheck`: a grammar) is rejected with every draft after it, so the most
        any generating row's processors allow in a row (`count` where a row has no such processor); each row's
        prefix taken from where its processors see it (`scores`)."""
        if count == 0:
            return 0
        own, longest = self._row_prefix_processors or {}, 0
        for b in slots.live():
            checks: list[DraftCheck] = [p for p in own.get(slots.caller_rows[b], self._prefix_processors)
                                        if callable(getattr(p, "allowed_count", None))]  # fmt: skip
            if not checks:  # the common case: no grammar, nothing read from the device
                return count
            begin = slots.padding.host[b] if slots.batched else self.offset
            prefix, drafts = slots.ids[b, begin:start].tolist(), slots.ids[b, start : start + count].tolist()
            longest = max(longest, min(check.allowed_count(prefix, drafts) for check in checks))
            if longest == count:
                break
        return longest

    @property
    def do_sample(self) -> bool:
        return self.config.do_sample

    def scores(self, logits: torch.Tensor, context: torch.Tensor, rows: RowStarts | None = None) -> torch.Tensor:
        """Processed scores [B, q, V] for logits [B, q, V].

        `context` [B, L] ends with the token fed at the last of the q positions, so position j was
        computed after the prefix `context[:, offset : L - (q - 1 - j)]`. `rows` (batches): row b's
        prefix begins at column rows.starts[b] instead, and prefix-dependent processors see one row at a time.
        """
        batch, query_length, vocab = logits.shape
        if rows is None:
            if self._prefix_processors:
                logits = process_positions(self._prefix_processors, context, self.offset, logits)
        elif self._prefix_processors or any((self._row_prefix_processors or {}).values()):
            own = self._row_prefix_processors or {}
            views = logits.split(1)
            parts = [
                process_positions(own.get(row, self._prefix_processors), context[b : b + 1], start, views[b])
                for b, (start, row) in enumerate(zip(rows.starts, rows.caller_rows))
            ]
            if any(part is not view for part, view in zip(parts, views)):  # else nothing changed
                logits = torch.cat(parts)
        if self._warpers:
            flat = logits.reshape(batch * query_length, vocab)
            for warper in self._warpers:  # row-wise: they ignore the prefix
                flat = warper(None, flat)
            logits = flat.reshape(batch, query_length, vocab)
        return logits

    def probabilities(self, logits: torch.Tensor, context: torch.Tensor, rows: RowStarts | None = None) -> torch.Tensor:
        """p (or q) [B, q, V]: softmax of the processed scores."""
        return torch.softmax(self.scores(logits, context, rows), dim=-1)

    def greedy(self, logits: torch.Tensor, context: torch.Tensor, rows: RowStarts | None = None) -> torch.Tensor:
        """argmax tokens [B, q]."""
        return greedy_tokens(self.scores(logits, context, rows))

    def greedy_from(
        self, ids: torch.Tensor, start: int, rows: RowStarts | None = None
    ) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """`choose(logits, end)`: the argmax tokens [B, q] of `logits` for positions end − q .. end − 1 of a pass whose
        first position follows column start − 1 of `ids` [B, T] (each position's prefix ends at its own column):
        what greedy verification with the head on demand asks for (`engine.head_on_demand`)."""

        def choose(logits: torch.Tensor, end: int) -> torch.Tensor:
            return self.greedy(logits, ids[:, : start + end - 1], rows)

        return choose


class DraftCheck(Protocol):
    """A prefix processor that knows which tokens it forbids (a grammar): `allowed_count(prefix, drafts)`, how many
    of `drafts` it allows in a row after `prefix` (the ids it would be called with, as lists)."""

    def allowed_count(self, prefix: list[int], drafts: list[int]) -> int: ...


_ARGMAX_BLOCK = 1024  # columns per block of `greedy_tokens`


def greedy_tokens(scores: torch.Tensor) -> torch.Tensor:
    """`scores.argmax(dim=-1)` ([..., V] -> [...]): the first index of each row's maximum, NaN counting as the
    maximum. On the CPU, where torch's argmax is not vectorized (0.4 ms for one 262k row, 10x its `amax`), it is
    computed blockwise with the same result: the maximum of each block of 1024 columns, the first block holding the
    row's maximum (`argmax` over the block maxima), the first index of it inside that block."""
    vocab = scores.shape[-1]
    if scores.device.type != "cpu" or vocab % _ARGMAX_BLOCK or vocab < 4 * _ARGMAX_BLOCK:
        return scores.argmax(dim=-1)
    blocks = scores.reshape(-1, vocab // _ARGMAX_BLOCK, _ARGMAX_BLOCK)
    block = blocks.amax(dim=-1).argmax(dim=-1)  # [R]
    inner = blocks[torch.arange(blocks.shape[0], device=scores.device), block].argmax(dim=-1)
    return (block * _ARGMAX_BLOCK + inner).reshape(scores.shape[:-1])


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs` [..., V] -> [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])

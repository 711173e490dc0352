"""Processors on all verified positions at once (`engine.position_processors`): the scores, and the greedy tokens,
equal transformers' processor called at each position with that position's prefix, bit for bit; the fast path is
really taken (the per-position call is made to fail); what it cannot do still runs per position."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from assisted_backends.engine import position_processors
from assisted_backends.engine.position_processors import process_positions
from assisted_backends.engine.sampling import SamplingConfig, TokenSelector
from assisted_backends.engine.slots import RowStarts
from assisted_backends.options.penalties import OpenAIPenaltiesLogitsProcessor

V = 50
EOS = [2, 7]


def _per_position(processors: list[LogitsProcessor], context: torch.Tensor, start: int, logits: torch.Tensor):
    """The reference: each processor called at position j on `context[:, start : L − (q − 1 − j)]`."""
    q, length = logits.shape[1], context.shape[1]
    rows = []
    for j in range(q):
        row = logits[:, j].clone()
        for processor in processors:
            row = processor(context[:, start : length - (q - 1 - j)], row)
        rows.append(row)
    return torch.stack(rows, dim=1)


def _no_per_position(monkeypatch) -> None:
    def refuse(*_):
        raise AssertionError("ran per position: the at-once path was not taken")

    monkeypatch.setattr(position_processors, "_per_position", refuse)


def _case(seed: int, batch: int = 2, q: int = 5, length: int = 14) -> tuple[torch.Tensor, torch.Tensor]:
    """(context [B, L], logits [B, q, V]): repeated tokens across the prompt and the drafts, negative scores and a
    tie, EOS at the top so masking it changes the argmax."""
    generator = torch.Generator().manual_seed(seed)
    context = torch.randint(0, 12, (batch, length), generator=generator)  # few distinct ids: repeats
    context[:, -2] = context[:, -4]  # a draft repeating an earlier draft
    logits = torch.randn(batch, q, V, generator=generator) * 3
    logits[:, :, EOS[0]] = 9.0
    logits[:, 1, 3] = logits[:, 1, 4]
    return context, logits


MIN_NEW = {  # prompt 6 of 14 columns: positions see 4..8 new tokens; the limit falls inside the chain
    "min_new_tokens_crossing": lambda: [MinNewTokensLengthLogitsProcessor(6, 6, EOS)],
    "min_new_tokens_all_masked": lambda: [MinNewTokensLengthLogitsProcessor(6, 20, EOS)],
    "min_new_tokens_satisfied": lambda: [MinNewTokensLengthLogitsProcessor(6, 2, EOS)],
    "min_length_crossing": lambda: [MinLengthLogitsProcessor(12, torch.tensor(EOS))],
    "eos_outside_vocab": lambda: [MinNewTokensLengthLogitsProcessor(6, 6, [2, V + 3])],
    "both_minimums": lambda: [MinLengthLogitsProcessor(13, EOS), MinNewTokensLengthLogitsProcessor(6, 6, EOS[::-1])],
    "both_minimums_other_eos": lambda: [
        MinLengthLogitsProcessor(11, [EOS[1]]),
        MinNewTokensLengthLogitsProcessor(6, 7, EOS),
    ],
}
PENALTIES = {
    "repetition": lambda: [RepetitionPenaltyLogitsProcessor(1.3)],
    "repetition_prompt_ignored": lambda: [RepetitionPenaltyLogitsProcessor(0.7, prompt_ignore_length=8)],
    "openai": lambda: [OpenAIPenaltiesLogitsProcessor(0.6, 0.4, prompt_length=4)],
    "openai_negative": lambda: [OpenAIPenaltiesLogitsProcessor(-1.5, 1.1, prompt_length=9)],
    "openai_answer_in_drafts_only": lambda: [OpenAIPenaltiesLogitsProcessor(0.5, 0.5, prompt_length=12)],
    "all_in_order": lambda: [
        MinNewTokensLengthLogitsProcessor(6, 6, EOS),
        RepetitionPenaltyLogitsProcessor(1.3),
        OpenAIPenaltiesLogitsProcessor(0.6, 0.4, prompt_length=6),
    ],
}


@pytest.mark.parametrize("name", [*MIN_NEW, *PENALTIES])
@pytest.mark.parametrize("start", [0, 2])
def test_at_once_equals_each_position(monkeypatch, name, start):
    context, logits = _case(seed=len(name) + start)
    build = {**MIN_NEW, **PENALTIES}[name]
    expected = _per_position(build(), context, start, logits)
    kept = logits.clone()
    _no_per_position(monkeypatch)
    got = process_positions(build(), context, start, logits)
    assert torch.equal(got, expected)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert torch.equal(logits, kept)  # the logits themselves are never written


def test_min_new_tokens_masks_exactly_the_short_positions():
    context, logits = _case(seed=1, batch=1)
    got = process_positions([MinNewTokensLengthLogitsProcessor(6, 6, EOS)], context, 0, logits)
    # position j has 14 − 4 + j − 6 = 4 + j new tokens: j = 0, 1 below 6
    assert got[0, :2, EOS].eq(float("-inf")).all() and not got[0, 2:, EOS].isinf().any()
    assert got.argmax(-1)[0, 2] == EOS[0] and got.argmax(-1)[0, 0] != EOS[0]


def test_nothing_to_change_returns_the_logits_themselves(monkeypatch):
    context, logits = _case(seed=2)
    _no_per_position(monkeypatch)
    satisfied = [MinNewTokensLengthLogitsProcessor(6, 2, EOS), MinLengthLogitsProcessor(3, EOS)]
    assert process_positions(satisfied, context, 0, logits) is logits
    nothing_counted = [OpenAIPenaltiesLogitsProcessor(0.5, 0.5, prompt_length=40)]
    assert process_positions(nothing_counted, context, 0, logits) is logits


class _Shifted(RepetitionPenaltyLogitsProcessor):
    """A subclass changing what the processor does: must run per position."""

    def __call__(self, input_ids, scores):
        return super().__call__(input_ids, scores) + 1.0


class _Counted(OpenAIPenaltiesLogitsProcessor):
    def __call__(self, input_ids, scores):
        return super().__call__(input_ids, scores) * 2.0


@pytest.mark.parametrize("processor", [_Shifted(1.3), _Counted(0.5, 0.5, 4), RepetitionPenaltyLogitsProcessor(
    1.3, prompt_ignore_length=torch.tensor([3, 5]))], ids=["subclass", "count_subclass", "row_lengths"])  # fmt: skip
def test_what_it_cannot_do_runs_per_position(processor):
    context, logits = _case(seed=3)
    assert torch.equal(process_positions([processor], context, 0, logits), _per_position([processor], context, 0,
                                                                                          logits))  # fmt: skip


def test_unknown_processor_between_known_ones_keeps_the_order():
    context, logits = _case(seed=4, length=16)
    processors = [RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(2),
                  MinNewTokensLengthLogitsProcessor(6, 8, EOS)]  # fmt: skip
    assert torch.equal(process_positions(processors, context, 1, logits), _per_position(processors, context, 1, logits))


def test_ids_outside_the_vocabulary_run_per_position():
    context, logits = _case(seed=5)
    context[0, 3] = V + 4  # an embedding row the head lacks: transformers' processor drops it
    processors = [RepetitionPenaltyLogitsProcessor(1.3), MinNewTokensLengthLogitsProcessor(6, 6, EOS)]
    assert torch.equal(process_positions(processors, context, 0, logits), _per_position(processors, context, 0,
                                                                                        logits))  # fmt: skip


def test_batch_rows_with_their_own_processors_and_lengths(monkeypatch):
    """Three rows of a queue's batch, each with processors built for its own prompt (its own start column and
    prompt length): the selector's scores equal each row's processors at each of its positions."""
    context, logits = _case(seed=6, batch=3, q=4, length=16)
    starts = [0, 3, 5]
    own = {
        0: [MinNewTokensLengthLogitsProcessor(6, 7, EOS), RepetitionPenaltyLogitsProcessor(1.2)],
        1: [MinNewTokensLengthLogitsProcessor(4, 3, EOS), OpenAIPenaltiesLogitsProcessor(0.3, 0.7, 4)],
        2: [],
    }
    selector = TokenSelector(SamplingConfig(), row_processors=[own[0], own[1], own[2]])
    expected = torch.cat([_per_position(own[b], context[b : b + 1], starts[b], logits[b : b + 1]) for b in range(3)])
    _no_per_position(monkeypatch)
    got = selector.scores(logits, context, RowStarts(starts, [0, 1, 2]))
    assert torch.equal(got, expected)
    assert not torch.equal(got, logits)
    satisfied = TokenSelector(SamplingConfig(), row_processors=[[MinNewTokensLengthLogitsProcessor(4, 1, EOS)]] * 3)
    assert satisfied.scores(logits, context, RowStarts(starts, [0, 1, 2])) is logits


def test_selector_greedy_and_probabilities_with_a_penalty_config(monkeypatch):
    context, logits = _case(seed=7, batch=1, q=6)
    selector = TokenSelector(SamplingConfig(do_sample=True, temperature=0.8, repetition_penalty=1.4))
    expected = _per_position([RepetitionPenaltyLogitsProcessor(1.4)], context, 0, logits) / 0.8
    _no_per_position(monkeypatch)
    assert torch.equal(selector.probabilities(logits, context), torch.softmax(expected, dim=-1))


def _hard_rows(vocab: int) -> torch.Tensor:
    """[7, vocab] rows where a blockwise argmax could go wrong: ties across and inside blocks, NaN, −inf, signed
    zeros, the maximum in the last column."""
    generator = torch.Generator().manual_seed(8)
    rows = torch.randn(7, vocab, generator=generator)
    rows[0, [5000, 1030, 4097]] = 50.0  # the same maximum in three blocks: the first index wins
    rows[1, [2050, 2049]] = 50.0  # a tie inside one block
    rows[2, [3000, 1500]] = float("nan")  # NaN counts as the maximum: the first NaN
    rows[3] = float("-inf")
    rows[4] = 0.0
    rows[4, :3000] = -0.0
    rows[5, -1] = 50.0
    rows[6] = torch.linspace(1.0, 0.0, vocab)
    return rows


@pytest.mark.parametrize("vocab", [8192, 49152, 6000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_is_torch_argmax(vocab, dtype):
    from assisted_backends.engine.sampling import greedy_tokens

    rows = _hard_rows(vocab).to(dtype)
    assert torch.equal(greedy_tokens(rows), rows.argmax(dim=-1))
    batched = torch.stack([rows, rows.flip(0)])  # [2, 7, V]
    assert torch.equal(greedy_tokens(batched), batched.argmax(dim=-1))
    strided = batched.transpose(0, 1)  # not contiguous
    assert torch.equal(greedy_tokens(strided), strided.argmax(dim=-1))

"""Log-probabilities through a queue (`logprobs=`, `engine.outputs.LogprobRecord` driven by `Slots.commit`).

Each prompt's entries equal, token for token, log softmax of the scores `generate(output_scores=True)` gives for
that prompt alone without a draft: the chosen token's and the top k's (ids and values), for rows of the first batch
and rows that join mid-run, rows ending early at EOS, with a draft model, with prompt lookup and in a live queue
whose rows arrive and leave while it runs. The scores are the processed ones (a repetition penalty changes them);
nothing is computed when no one asks; the range is refused by name.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from live_sources import ArrivingSource
from test_batches import pair, prompts

from assisted_backends import AssistedGenerator, generate, generate_queue
from assisted_backends.api.queue import generate_live
from assisted_backends.engine import outputs
from assisted_backends.engine.outputs import LogprobRecord, TokenLogprobs
from assisted_backends.options.errors import OptionError

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = 10
TOP = 3
LENGTHS = (6, 14, 3, 9, 25)  # 5 prompts through 2 slots: three join mid-run
SLOTS = 2
SPECULATION = {
    "draft_model": lambda draft: dict(assistant_model=draft, num_assistant_tokens=3),
    "prompt_lookup": lambda draft: dict(prompt_lookup_num_tokens=3),
}
# The verify pass scores γ + 1 positions of several rows at once: fp32 logits differ from one-token passes of one
# row in the last bits (`engine.outputs`; measured here up to 1.1e-5 for two rows, 2.9e-5 with drafts, and 0 for one
# slot without a draft: `test_one_slot_without_a_draft_is_bitwise_plain`), so values agree to float tolerance and
# tokens exactly.
TOLERANCE = dict(rtol=1e-5, atol=1e-4)


@cache
def queue_prompts() -> tuple[torch.Tensor, ...]:
    return tuple(prompts(LENGTHS, seed=3))


@cache
def early_eos() -> int:
    """An EOS id that ends prompt 1 after 4 tokens (others wherever it comes first)."""
    target, _ = pair("llama")
    first = generate(target, queue_prompts()[1][None], max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return int(first.sequences[0, LENGTHS[1] + 3])


def plain(prompt: torch.Tensor, **options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [n], log softmax of the processed scores [n, V], of the raw logits [n, V]) of `prompt` alone,
    without a draft."""
    target, _ = pair("llama")
    out = generate(target, prompt[None], max_new_tokens=NEW, do_sample=False, pad_token_id=0, output_scores=True,
                   output_logits=True, return_dict_in_generate=True, **options)  # fmt: skip
    tokens = out.sequences[0, prompt.shape[0] :]
    tokens = tokens[: len(out.scores)]
    scores = torch.log_softmax(torch.stack([s[0] for s in out.scores]).float(), dim=-1)
    logits = torch.log_softmax(torch.stack([s[0] for s in out.logits]).float(), dim=-1)
    return tokens, scores, logits


def assert_plain(
    got: TokenLogprobs, prompt: torch.Tensor, label: str, top: int = TOP, count: int | None = None, **options
) -> None:
    """`got` is `prompt`'s plain decoding (its first `count` tokens), log-probabilities to float tolerance."""
    tokens, reference, _ = plain(prompt, **options)
    tokens, reference = tokens[:count], reference[:count]
    assert got.tokens.tolist() == tokens.tolist(), label
    assert got.top_ids.shape == (len(tokens), top), label
    named = {**TOLERANCE, "msg": lambda message: f"{label}: {message}"}
    torch.testing.assert_close(got.logprobs, reference.gather(-1, tokens[:, None])[:, 0], **named)
    expected = reference.topk(top, dim=-1)
    assert got.top_ids.tolist() == expected.indices.tolist(), label
    torch.testing.assert_close(got.top_logprobs, expected.values, **named)
    assert top == 0 or bool((got.top_logprobs[:, 0] == got.logprobs).all()), f"{label}: greedy takes the top token"


@pytest.mark.parametrize("speculation", SPECULATION)
def test_queue_logprobs_equal_plain_decodings_scores(speculation, one_token_matches):
    target, draft = pair("llama")
    eos = early_eos()
    result = generate_queue(target, queue_prompts(), slots=SLOTS, max_new_tokens=NEW, eos_token_id=eos,
                            pad_token_id=0, logprobs=TOP, **SPECULATION[speculation](draft))  # fmt: skip
    # drafts verified (a random model seldom takes prompt lookup's: those rejected must leave no entry), and the draft
    # model's accepted
    assert result.stats.drafted > 0 and (result.stats.accepted > 0 or speculation == "prompt_lookup")
    assert result.stats.joins >= len(LENGTHS) - SLOTS
    lengths = [len(row) for row in result.logprobs]
    assert min(lengths) < NEW == max(lengths), "a row must end early at EOS and another run to the limit"
    for i, (prompt, row) in enumerate(zip(queue_prompts(), result.logprobs)):
        assert row.tokens.tolist() == result.tokens[i].tolist()
        assert_plain(row, prompt, f"prompt {i}", eos_token_id=eos)


def test_one_slot_without_a_draft_is_bitwise_plain():
    """The same passes as plain decoding (one row, one position): the entries are plain decoding's, bit for bit."""
    target, _ = pair("llama")
    result = generate_queue(target, queue_prompts()[:3], slots=1, max_new_tokens=NEW, pad_token_id=0, logprobs=TOP)
    for prompt, row in zip(queue_prompts(), result.logprobs):
        tokens, reference, _ = plain(prompt)
        assert torch.equal(row.logprobs, reference.gather(-1, tokens[:, None])[:, 0])
        assert torch.equal(row.top_logprobs, reference.topk(TOP, dim=-1).values)


def test_logprobs_are_those_of_the_processed_scores():
    """With a repetition penalty the processed scores differ from the raw logits: the entries follow the former."""
    target, draft = pair("llama")
    options = dict(repetition_penalty=1.5)
    result = generate_queue(target, queue_prompts()[:3], slots=SLOTS, max_new_tokens=NEW, pad_token_id=0,
                            logprobs=2, assistant_model=draft, num_assistant_tokens=3, **options)  # fmt: skip
    _, scores, logits = plain(queue_prompts()[0], **options)
    assert not torch.allclose(scores, logits, atol=1e-3), "the penalty must change the scores for this test to bite"
    for i, (prompt, row) in enumerate(zip(queue_prompts(), result.logprobs)):
        assert_plain(row, prompt, f"prompt {i}", top=2, **options)


def test_live_queue_rows_arriving_and_leaving_get_their_logprobs():
    target, draft = pair("llama")
    generator = AssistedGenerator(target, draft)
    rows = [row.tolist() for row in queue_prompts()]
    source = ArrivingSource(rows, [NEW, 4, NEW, 7, NEW], arrive_after=[0, 0, 2, 3, 5], cancel_at={2: 6})
    record, finished, progressed = LogprobRecord(TOP), {}, []

    def progress(i: int, tokens: torch.Tensor) -> None:  # the record holds every token the hooks see
        progressed.append(record.row(i).tokens.tolist() == tokens.tolist())

    generate_live(generator, source, SLOTS, 256, lambda i, t: finished.setdefault(i, t.tolist()), progress,
                  logprobs=record, do_sample=False, pad_token_id=0, num_assistant_tokens=3)  # fmt: skip
    assert sorted(finished) == list(range(len(rows))) and progressed and all(progressed)
    for i, prompt in enumerate(queue_prompts()):
        got = record.row(i)
        assert got.tokens.tolist() == finished[i]
        if i == 2:  # left mid-way: a prefix of its answer, each entry still exact
            assert 0 < len(got) < NEW
        else:
            assert len(got) == source.limits[i]
        assert_plain(got, prompt, f"prompt {i}", count=len(got))


def test_the_slots_record_committed_tokens_only_by_caller_row():
    """`Slots.commit` feeds the record: the committed tokens' entries under their caller row, none for the drafts
    past them (rolled back) nor for a row that ends without new tokens; rows keep their entries across a move."""
    from assisted_backends.engine.realign import RowMove
    from assisted_backends.engine.slots import Slots
    from assisted_backends.engine.stats import GenerationStats

    record = LogprobRecord(2)
    slots = Slots(torch.tensor([[1, 2, 3], [4, 5, 6]]), 10, 0, logprobs=record)
    slots.open(GenerationStats(), 5, {}, None)
    scores = torch.randn(2, 3, 16)
    slots.write_draft(3, torch.tensor([[7, 1, 2], [6, 3, 4]]))  # 3 drafted; row 0 keeps 2, row 1 keeps 1
    slots.commit({0: 2, 1: 1}, {0: False, 1: False}, 3, scores)
    expected = torch.log_softmax(scores, dim=-1)
    assert record.row(0).tokens.tolist() == [7, 1] and record.row(1).tokens.tolist() == [6]
    assert torch.equal(record.row(0).logprobs, expected[0, [0, 1], [7, 1]])
    assert torch.equal(record.row(1).top_ids, expected[1, :1].topk(2).indices)
    kept = (1, 0)  # the rows swap slots: entries stay with their caller rows
    slots.move(RowMove(torch.tensor(kept), torch.zeros(2, dtype=torch.long), (0, 0), kept), [0, 0], 5)
    slots.write_draft(5, torch.tensor([[9], [8]]))
    slots.commit({0: 1, 1: 1}, {0: False, 1: False}, 5, torch.randn(2, 1, 16))
    assert record.row(0).tokens.tolist() == [7, 1, 8] and record.row(1).tokens.tolist() == [6, 9]
    slots.finish(0)  # its caller left: nothing new
    assert len(record.row(1)) == 2


def test_nothing_is_computed_when_not_asked(monkeypatch):
    target, draft = pair("llama")
    calls = []
    monkeypatch.setattr(outputs.LogprobRecord, "add", lambda *args: calls.append(args))
    result = generate_queue(target, queue_prompts()[:3], slots=SLOTS, max_new_tokens=4, pad_token_id=0,
                            assistant_model=draft)  # fmt: skip
    assert result.logprobs is None and calls == []
    zero = generate_queue(target, queue_prompts()[:1], slots=SLOTS, max_new_tokens=4, pad_token_id=0, logprobs=0)
    assert len(calls) > 0 and zero.logprobs is not None


def test_top_zero_keeps_the_chosen_tokens_only():
    target, _ = pair("llama")
    result = generate_queue(target, queue_prompts()[:2], slots=SLOTS, max_new_tokens=5, pad_token_id=0, logprobs=0)
    for prompt, row in zip(queue_prompts(), result.logprobs):
        assert row.top_ids.shape == (5, 0)
        assert_plain(row, prompt, "top 0", top=0, count=5)


@pytest.mark.parametrize("value", [-1, 21, True, 2.0, "3"])
def test_logprobs_out_of_range_is_refused_by_name(value):
    target, _ = pair("llama")
    with pytest.raises(OptionError, match="logprobs must be an int from 0 to 20"):
        generate_queue(target, queue_prompts()[:1], max_new_tokens=2, pad_token_id=0, logprobs=value)


def test_queue_scores_point_to_logprobs():
    target, _ = pair("llama")
    with pytest.raises(OptionError, match="logprobs=k"):
        generate_queue(target, queue_prompts()[:1], max_new_tokens=2, pad_token_id=0, output_scores=True)

"""Batches (docs/design.md rule 7): each row of a left-padded batch is exactly what the target gives that prompt alone.

Greedy identity per row against `model.generate` on the row's prompt *alone* (unpadded), over
architectures of every cache kind (full, sliding, hybrid, chunked, tuple caches) with every drafter
and both layouts (the sliding windows of tests/architectures.py are shorter than the sequences, so
rows that move under a window are covered); rows that stop at different EOS positions or at the token
limit; the returned layout equal to batched `model.generate`'s; rows that do not depend on their
companions; per-row processors, stop strings and stats; a draft of another tokenizer.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from any_draft_fixtures import MEMORIZED, saved_memorized_pair
from architectures import build, refused_here
from tiny_models import noisy_copy, tiny_model

from assisted_backends import generate
from assisted_backends.api.queue import left_padded

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = 24
LENGTHS = (6, 14, 3)  # one batch of three prompts of different lengths
ARCHS = ("llama", "mistral", "gemma3_text", "qwen3", "gpt2", "gpt_bigcode", "llama4_text", "cohere2")
DRAFTERS = {
    "draft_model": lambda draft: dict(assistant_model=draft, num_assistant_tokens=3),
    "prompt_lookup": lambda draft: dict(prompt_lookup_num_tokens=3),
    "early_exit": lambda draft: dict(assistant_early_exit=1, num_assistant_tokens=2),
}
LAYOUTS = {"dynamic": dict(cache_layout="dynamic"), "static_shapes": dict(static_shapes=True, bucket_size=8)}


def prompts(lengths: tuple[int, ...] = LENGTHS, seed: int = 3, vocab: int = 128) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=generator) for n in lengths]


def alone(model, row: torch.Tensor, max_new_tokens: int = NEW, **kwargs) -> torch.Tensor:
    """The new tokens of `model.generate` on `row` alone (greedy)."""
    kwargs.setdefault("pad_token_id", 0)
    output = model.generate(row[None], max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return output[0, row.shape[0] :]


@cache
def pair(model_type: str):
    target = build(model_type, seed=0)
    return target, noisy_copy(target, seed=1, scale=0.05)


@cache
def references(model_type: str) -> tuple[torch.Tensor, ...]:
    target, _ = pair(model_type)
    return tuple(alone(target, row) for row in prompts())


def assert_rows_alone(sequences: torch.Tensor, width: int, expected: tuple[torch.Tensor, ...], pad_id: int = 0):
    for b, tokens in enumerate(expected):
        assert torch.equal(sequences[b, width : width + tokens.shape[0]], tokens), f"row {b}"
        assert bool((sequences[b, width + tokens.shape[0] :] == pad_id).all()), f"row {b}: padding after its end"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("model_type", ARCHS)
def test_each_row_equals_its_prompt_alone(model_type, drafter, layout):
    if refused_here(model_type):
        pytest.skip(f"{model_type} cannot roll back on this transformers")
    target, draft = pair(model_type)
    ids, mask = left_padded(prompts())
    result = generate(
        target,
        ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        pad_token_id=0,
        **DRAFTERS[drafter](draft),
        **LAYOUTS[layout],
    )
    assert result.sequences.shape == (3, ids.shape[1] + NEW)
    assert torch.equal(result.sequences[:, : ids.shape[1]], ids), "prompts come back as given, padding included"
    assert_rows_alone(result.sequences, ids.shape[1], references(model_type))
    assert [row.new_tokens for row in result.stats.rows] == [NEW] * 3
    assert result.stats.batch_size == 3 and result.stats.new_tokens == 3 * NEW


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_end_at_their_own_eos_and_the_layout_is_model_generates(layout):
    target, draft = pair("llama")
    rows = prompts()
    eos = int(references("llama")[1][4])  # row 1 stops after 5 tokens; others wherever this id occurs first
    expected = tuple(alone(target, row, eos_token_id=eos) for row in rows)
    assert len({tokens.shape[0] for tokens in expected}) > 1, "rows must end at different steps"
    ids, mask = left_padded(rows)
    result = generate(
        target, ids, attention_mask=mask, assistant_model=draft, num_assistant_tokens=3,
        max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0, **LAYOUTS[layout],
    )  # fmt: skip
    assert_rows_alone(result.sequences, ids.shape[1], expected)
    assert [row.new_tokens for row in result.stats.rows] == [tokens.shape[0] for tokens in expected]
    batched = target.generate(
        ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    assert torch.equal(result.sequences, batched), "the same [B, P + longest] layout as batched model.generate"
    finished = [row.finished_s for row in result.stats.rows]
    assert finished[1] <= max(finished), "the short row finishes no later than the longest"


def test_a_row_does_not_depend_on_its_companions():
    target, draft = pair("mistral")
    row = prompts()[0]
    outputs = []
    for companions in (prompts((9,), seed=7), prompts((2, 30, 11), seed=8)):
        ids, mask = left_padded([row, *companions])
        result = generate(
            target, ids, attention_mask=mask, assistant_model=draft, num_assistant_tokens=4, max_new_tokens=NEW,
            pad_token_id=0,
        )  # fmt: skip
        outputs.append(result.sequences[0, ids.shape[1] :])
    assert torch.equal(outputs[0], outputs[1])
    assert torch.equal(outputs[0], references("mistral")[0])


def test_rows_hit_the_token_limit_while_others_accept_more():
    """A row that accepted more than another moves the batch; max_new_tokens is per row."""
    target, draft = pair("qwen3")
    rows = prompts((5, 5, 40), seed=11)
    ids, mask = left_padded(rows)
    for max_new_tokens in (1, 2, 7):
        result = generate(
            target, ids, attention_mask=mask, assistant_model=draft, num_assistant_tokens=4,
            max_new_tokens=max_new_tokens, pad_token_id=0,
        )  # fmt: skip
        assert_rows_alone(result.sequences, ids.shape[1], tuple(alone(target, r, max_new_tokens) for r in rows))


def test_prefix_processors_see_each_row_alone():
    """Repetition penalty, no-repeat n-grams and min_new_tokens are built and applied per row (its own prompt)."""
    target = tiny_model("llama", seed=0, eos_token_id=5)
    draft = noisy_copy(target, seed=1, scale=0.05)
    options = dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=6)
    rows = prompts((4, 12, 7), seed=5)
    ids, mask = left_padded(rows)
    result = generate(
        target, ids, attention_mask=mask, assistant_model=draft, num_assistant_tokens=3, max_new_tokens=16,
        pad_token_id=0, **options,
    )  # fmt: skip
    assert_rows_alone(result.sequences, ids.shape[1], tuple(alone(target, r, 16, **options) for r in rows))


def test_sampling_batches_reproduce_with_a_seed_and_stay_in_the_vocabulary():
    target, draft = pair("llama")
    ids, mask = left_padded(prompts())
    runs = [
        generate(
            target,
            ids,
            attention_mask=mask,
            assistant_model=draft,
            num_assistant_tokens=3,
            max_new_tokens=NEW,
            do_sample=True,
            seed=4,
            pad_token_id=0,
        )  # fmt: skip
        for _ in range(2)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.drafted > 0 and 0 < runs[0].stats.accepted < runs[0].stats.drafted
    assert int(runs[0].sequences.max()) < 128


def test_stats_per_row_add_up():
    target, draft = pair("llama")
    ids, mask = left_padded(prompts())
    stats = generate(
        target, ids, attention_mask=mask, assistant_model=draft, num_assistant_tokens=3, max_new_tokens=NEW,
        pad_token_id=0,
    ).stats  # fmt: skip
    assert len(stats.rows) == 3
    for field in ("new_tokens", "drafted", "accepted", "rounds"):
        assert getattr(stats, field) == sum(getattr(row, field) for row in stats.rows), field
    assert stats.verify_passes == max(row.rounds for row in stats.rows)
    assert 0 < stats.row_moves <= stats.verify_passes and stats.move_s < stats.decode_s


@pytest.fixture(scope="module")
def memorized(tmp_path_factory):
    target, draft, target_tokenizer, draft_tokenizer = saved_memorized_pair(tmp_path_factory.mktemp("batch_any_draft"))
    target_tokenizer.padding_side = "left"
    if target_tokenizer.pad_token is None:
        target_tokenizer.pad_token = target_tokenizer.eos_token or target_tokenizer.unk_token
    return target, draft, target_tokenizer, draft_tokenizer


@pytest.mark.parametrize("layout", ("dynamic", "static"))
def test_a_draft_of_another_tokenizer_drafts_each_row(memorized, layout):
    target, draft, target_tokenizer, draft_tokenizer = memorized
    texts = [MEMORIZED[:20], MEMORIZED[30:38], MEMORIZED[5:60]]
    pad_id = target_tokenizer.pad_token_id
    encoded = target_tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    rows = [target_tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0] for text in texts]
    result = generate(
        target, encoded.input_ids, attention_mask=encoded.attention_mask, assistant_model=draft,
        tokenizer=target_tokenizer, assistant_tokenizer=draft_tokenizer, num_assistant_tokens=4, max_new_tokens=30,
        pad_token_id=pad_id, cache_layout=layout,
    )  # fmt: skip
    expected = tuple(alone(target, row, 30, pad_token_id=pad_id) for row in rows)
    assert_rows_alone(result.sequences, encoded.input_ids.shape[1], expected, pad_id)
    assert all(row.accepted > 0 for row in result.stats.rows), "every row's own draft was used"


def test_stop_strings_stop_each_row_where_it_would_stop_alone(memorized):
    target, _, tokenizer, _ = memorized
    texts = [MEMORIZED[:12], MEMORIZED[40:52]]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    rows = [tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0] for text in texts]
    options = dict(stop_strings=["a"], tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id)
    expected = tuple(alone(target, row, 30, **options) for row in rows)
    assert len({tokens.shape[0] for tokens in expected}) > 1 and all(t.shape[0] < 30 for t in expected)
    result = generate(
        target, encoded.input_ids, attention_mask=encoded.attention_mask, prompt_lookup_num_tokens=4,
        max_new_tokens=30, **options,
    )  # fmt: skip
    assert_rows_alone(result.sequences, encoded.input_ids.shape[1], expected, tokenizer.pad_token_id)


def test_streaming_a_batch_is_refused_by_name():
    target, _ = pair("llama")
    ids, mask = left_padded(prompts())

    class Sink:  # records what it is given: a batch must be refused before anything is streamed
        def __init__(self) -> None:
            self.calls: list[str] = []

        def put(self, value) -> None:
            self.calls.append("put")

        def end(self) -> None:
            self.calls.append("end")

    sink = Sink()
    with pytest.raises(ValueError, match="streamer streams one sequence, but input_ids gives 3 rows"):
        generate(target, ids, attention_mask=mask, max_new_tokens=2, streamer=sink)
    assert sink.calls == []

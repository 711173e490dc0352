"""Queues (`api.queue`, `engine.joins`): many prompts through B slots, each slot refilled as its row ends.

Every prompt's tokens equal `model.generate` on that prompt alone (greedy), whatever its neighbours and
whenever it joined: over architectures of every cache kind with every drafter and both layouts, rows
ending at EOS at different rounds (one at its very first token), a prompt longer than the batch's
shared length joining mid-run (every row moves right first), per-row processors, stop strings and a
draft of another tokenizer. Also: results in the prompts' order and `on_finish` in the order rows end,
the input forms, the refusals, and fewer target passes than fixed batches of the same prompts.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from any_draft_fixtures import MEMORIZED, saved_memorized_pair
from architectures import refused_here
from test_batches import ARCHS, DRAFTERS, LAYOUTS, alone, left_padded, pair, prompts
from tiny_models import noisy_copy, tiny_model

from assisted_backends import AssistedGenerator, generate, generate_queue
from assisted_backends.engine import joins
from assisted_backends.options.errors import OptionError
from assisted_backends.options.fields import QUEUE_REFUSED

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = 12
# Lengths: the 40-token prompt joins after the first rows ended, when the shared length is at most 14 + NEW.
LENGTHS = (6, 14, 3, 9, 40, 5, 11)
SLOTS = 3
QUEUE_DRAFTERS = {"none": lambda draft: {}, **DRAFTERS}


@cache
def queue_prompts() -> tuple[torch.Tensor, ...]:
    return tuple(prompts(LENGTHS, seed=3))


@cache
def eos_and_references(model_type: str) -> tuple[int, tuple[torch.Tensor, ...]]:
    """An EOS id that ends some rows early (row 1 after 5 tokens) and one row at its first token, and every
    prompt's tokens alone with it."""
    target, _ = pair(model_type)
    rows = queue_prompts()
    free = [alone(target, row, NEW) for row in rows]
    eos = int(free[1][4])
    return eos, tuple(alone(target, row, NEW, eos_token_id=eos) for row in rows)


def assert_each_alone(tokens: list[torch.Tensor], expected: tuple[torch.Tensor, ...]) -> None:
    assert len(tokens) == len(expected)
    for i, (got, want) in enumerate(zip(tokens, expected)):
        assert torch.equal(got.cpu(), want), f"prompt {i}: {got.tolist()} != {want.tolist()}"


@pytest.fixture
def widenings(monkeypatch) -> list[int]:
    """Counts the moves that make room for a joining prompt longer than the shared length."""
    seen: list[int] = []
    original = joins.widen

    def counted(pad, columns, device):
        seen.append(columns)
        return original(pad, columns, device)

    monkeypatch.setattr(joins, "widen", counted)
    return seen


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("drafter", QUEUE_DRAFTERS)
def test_rows_joining_mid_run_equal_their_prompt_alone(drafter, layout, widenings):
    target, draft = pair("llama")
    eos, expected = eos_and_references("llama")
    assert len({t.shape[0] for t in expected}) > 2 and min(t.shape[0] for t in expected) < NEW
    result = generate_queue(
        target, queue_prompts(), slots=SLOTS, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0,
        **QUEUE_DRAFTERS[drafter](draft), **LAYOUTS[layout],
    )  # fmt: skip
    assert_each_alone(result.tokens, expected)
    slots = 4 if layout == "static_shapes" else SLOTS  # static shapes: the batch bucket
    assert result.stats.joins == len(LENGTHS) - slots and result.stats.batch_size == slots
    assert widenings, "the 40-token prompt joined a batch whose shared length was shorter"
    rows = result.stats.rows
    assert [row.new_tokens for row in rows] == [t.shape[0] for t in expected]
    assert all(row.joined_s == 0 for row in rows[:slots]) and all(row.joined_s > 0 for row in rows[slots:])
    assert all(row.finished_s >= row.joined_s for row in rows)
    assert result.stats.verify_passes == result.stats.target_forwards - 1 - result.stats.joins
    assert result.stats.verify_passes >= max(row.rounds for row in rows)
    for field in ("new_tokens", "drafted", "accepted", "rounds"):
        assert getattr(result.stats, field) == sum(getattr(row, field) for row in rows), field
    if drafter in ("draft_model", "early_exit"):  # a draft with a cache: the joined rows' own rows were written
        options = dict(eos_token_id=eos, pad_token_id=0, **QUEUE_DRAFTERS[drafter](draft), **LAYOUTS[layout])
        alone_accepted = sum(
            generate(target, row[None], max_new_tokens=NEW, **options).stats.accepted for row in queue_prompts()[slots:]
        )
        joined_accepted = sum(row.accepted for row in rows[slots:])
        assert alone_accepted > 0 and joined_accepted >= 0.8 * alone_accepted, (joined_accepted, alone_accepted)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model_type", ARCHS)
def test_every_cache_kind_takes_joining_rows(model_type, layout):
    if refused_here(model_type):
        pytest.skip(f"{model_type} cannot roll back on this transformers")
    target, draft = pair(model_type)
    eos, expected = eos_and_references(model_type)
    result = generate_queue(
        target, queue_prompts(), slots=2, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0,
        assistant_model=draft, num_assistant_tokens=3, **LAYOUTS[layout],
    )  # fmt: skip
    assert_each_alone(result.tokens, expected)


@pytest.mark.parametrize("ending", (0, 4), ids=("in_the_first_batch", "joining"))
def test_a_row_that_ends_at_its_first_token_frees_its_slot_at_once(ending):
    target, draft = pair("llama")
    rows = queue_prompts()
    first = int(alone(target, rows[ending], 1)[0])  # that prompt's first token is EOS
    expected = tuple(alone(target, row, NEW, eos_token_id=first) for row in rows)
    assert expected[ending].tolist() == [first]
    result = generate_queue(
        target, rows, slots=2, max_new_tokens=NEW, eos_token_id=first, pad_token_id=0, assistant_model=draft,
        num_assistant_tokens=3,
    )  # fmt: skip
    assert_each_alone(result.tokens, expected)
    assert result.stats.rows[ending].rounds == 0 and result.stats.rows[ending].new_tokens == 1


@pytest.mark.parametrize("max_new_tokens", (1, 2, 5))
def test_short_limits_end_rows_at_their_first_tokens(max_new_tokens):
    target, draft = pair("qwen3")
    rows = queue_prompts()
    result = generate_queue(
        target, rows, slots=3, max_new_tokens=max_new_tokens, pad_token_id=0, assistant_model=draft,
        num_assistant_tokens=4,
    )  # fmt: skip
    assert_each_alone(result.tokens, tuple(alone(target, row, max_new_tokens) for row in rows))


def test_prefix_processors_are_each_prompts_own():
    """Repetition penalty, no-repeat n-grams and min_new_tokens are built for every prompt alone as it joins."""
    target = tiny_model("llama", seed=0, eos_token_id=5)
    draft = noisy_copy(target, seed=1, scale=0.05)
    options = dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=6)
    rows = prompts((4, 12, 7, 30, 2, 9), seed=5)
    result = generate_queue(
        target, rows, slots=2, max_new_tokens=16, pad_token_id=0, assistant_model=draft, num_assistant_tokens=3,
        **options,
    )  # fmt: skip
    assert_each_alone(result.tokens, tuple(alone(target, row, 16, **options) for row in rows))


@pytest.fixture(scope="module")
def memorized(tmp_path_factory):
    target, draft, target_tokenizer, draft_tokenizer = saved_memorized_pair(tmp_path_factory.mktemp("queue_any_draft"))
    return target, draft, target_tokenizer, draft_tokenizer


def _memorized_prompts(tokenizer) -> list[torch.Tensor]:
    texts = [MEMORIZED[:20], MEMORIZED[30:38], MEMORIZED[5:60], MEMORIZED[12:16], MEMORIZED[40:90]]
    return [tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0] for text in texts]


def test_stop_strings_end_each_joined_row_where_it_ends_alone(memorized):
    target, _, tokenizer, _ = memorized
    rows = _memorized_prompts(tokenizer)
    options = dict(stop_strings=["a"], tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id or 0)
    expected = tuple(alone(target, row, 30, **options) for row in rows)
    assert len({t.shape[0] for t in expected}) > 1 and all(t.shape[0] < 30 for t in expected)
    result = generate_queue(target, rows, slots=2, max_new_tokens=30, prompt_lookup_num_tokens=4, **options)
    assert_each_alone(result.tokens, expected)


def test_a_draft_of_another_tokenizer_drafts_each_joined_row(memorized):
    target, draft, target_tokenizer, draft_tokenizer = memorized
    rows = _memorized_prompts(target_tokenizer)
    pad_id = target_tokenizer.pad_token_id or 0
    result = generate_queue(
        target, rows, slots=2, max_new_tokens=30, pad_token_id=pad_id, assistant_model=draft,
        tokenizer=target_tokenizer, assistant_tokenizer=draft_tokenizer, num_assistant_tokens=4,
    )  # fmt: skip
    assert_each_alone(result.tokens, tuple(alone(target, row, 30, pad_token_id=pad_id) for row in rows))
    assert all(row.accepted > 0 for row in result.stats.rows), "every joined row's own draft was used"


def test_results_come_in_order_and_on_finish_as_rows_end():
    target, draft = pair("llama")
    eos, expected = eos_and_references("llama")
    ended: list[int] = []
    result = generate_queue(
        target, [row.tolist() for row in queue_prompts()], slots=SLOTS, max_new_tokens=NEW, eos_token_id=eos,
        pad_token_id=0, assistant_model=draft, on_finish=lambda index, tokens: ended.append(index),
    )  # fmt: skip
    assert_each_alone(result.tokens, expected)
    assert sorted(ended) == list(range(len(LENGTHS))) and ended != sorted(ended), "rows end out of order"
    finished = [row.finished_s for row in result.stats.rows]
    assert [finished[i] for i in ended] == sorted(finished[i] for i in ended)
    sequences = result.sequences(queue_prompts())
    assert torch.equal(sequences[0], torch.cat([queue_prompts()[0], expected[0]]))


def test_prompts_as_a_tensor_or_a_tokenized_dataset():
    target, _ = pair("llama")
    rows = prompts((5, 5, 5), seed=9)
    expected = tuple(alone(target, row, 6) for row in rows)
    as_tensor = generate_queue(target, torch.stack(rows), slots=2, max_new_tokens=6, pad_token_id=0)
    as_dataset = generate_queue(target, [{"input_ids": r.tolist()} for r in rows], slots=2, max_new_tokens=6,
                                pad_token_id=0)  # fmt: skip
    assert_each_alone(as_tensor.tokens, expected)
    assert_each_alone(as_dataset.tokens, expected)


def test_generate_many_on_a_generator_reuses_it():
    target, draft = pair("llama")
    generator = AssistedGenerator(target, draft)
    eos, expected = eos_and_references("llama")
    for slots in (1, 5):
        result = generator.generate_many(
            queue_prompts(), slots=slots, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0
        )
        assert_each_alone(result.tokens, expected)


@pytest.mark.parametrize(
    "arguments, option",
    [
        (dict(attention_mask=torch.ones(1, 3)), "attention_mask"),
        (dict(streamer=object()), "streamer"),
        (dict(max_length=30), "max_length"),
        (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
        (dict(slots=0), "slots"),
    ],
)
def test_what_belongs_to_one_batch_is_refused_by_name(arguments, option):
    target, _ = pair("llama")
    arguments = {"max_new_tokens": 4, **arguments} if option != "max_length" else arguments
    with pytest.raises(ValueError, match=option) as raised:
        generate_queue(target, queue_prompts(), pad_token_id=0, **arguments)
    if isinstance(raised.value, OptionError):
        assert raised.value.option == option
    if option in QUEUE_REFUSED and option != "max_length":  # the reason comes from the one refusal table
        # (max_length=30 is refused before the queue looks at it: it leaves no room after the longest prompt)
        assert QUEUE_REFUSED[option] in str(raised.value)


@pytest.mark.parametrize("bad", ([], [[]], [[1.5, 2.0]], torch.ones(3, dtype=torch.long)))
def test_empty_or_malformed_queues_are_refused(bad):
    target, _ = pair("llama")
    with pytest.raises(OptionError, match="prompts"):
        generate_queue(target, bad, max_new_tokens=4, pad_token_id=0)


def test_refill_needs_fewer_target_passes_than_fixed_batches():
    """The point of a queue: fixed batches end with their slowest row; refilled slots never idle while prompts
    wait. Counted in target passes (deterministic), greedy with EOS ending rows at different rounds."""
    target, draft = pair("llama")
    eos, expected = eos_and_references("llama")
    rows = queue_prompts()
    queue = generate_queue(
        target, rows, slots=SLOTS, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0, assistant_model=draft,
        num_assistant_tokens=3,
    )  # fmt: skip
    fixed = 0
    for first in range(0, len(rows), SLOTS):
        ids, mask = left_padded(list(rows[first : first + SLOTS]))
        fixed += generate(
            target, ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0,
            assistant_model=draft, num_assistant_tokens=3,
        ).stats.target_forwards  # fmt: skip
    assert_each_alone(queue.tokens, expected)
    assert queue.stats.target_forwards < fixed, (queue.stats.target_forwards, fixed)


def test_graph_capture_survives_joining_prompt_passes():
    """CUDA graphs (the backend's bookkeeping on CPU, tests/backends/test_cuda_graphs.py): a joining prompt's pass
    runs on a cache of its own, once, eagerly; the batch's captured verify and draft steps are kept, not captured
    again."""
    from test_cuda_graphs import CUDABackendOnCPU, graphs_of

    target, draft = pair("llama")
    eos, expected = eos_and_references("llama")
    backend = CUDABackendOnCPU()
    result = generate_queue(
        target, queue_prompts(), slots=2, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0,
        assistant_model=draft, num_assistant_tokens=3, backend=backend,
    )  # fmt: skip
    assert_each_alone(result.tokens, expected)
    assert result.stats.cache_layout == "static" and result.stats.joins == len(LENGTHS) - 2
    target_graphs, draft_graphs = graphs_of(backend, target, "target"), graphs_of(backend, draft, "draft")
    assert target_graphs.stats.caches_bound == 1 and draft_graphs.stats.caches_bound == 1
    # at most one graph per verify width [2, 1..γ + 1] (γ shrinks near a row's limit) for the whole queue
    assert target_graphs.stats.captures <= 4 and target_graphs.stats.replays > 3 * target_graphs.stats.captures
    assert all(dict(s)["input_ids"][0][0] == 2 for s in target_graphs.stats.signatures + draft_graphs.stats.signatures)

"""Chunked prefill (`engine.row_pass`, `engine.joins`): a prompt that joins running rows has its pass computed a chunk
per round. On the native decoder step the chunks give the same bits as one pass, so every row's tokens and logprobs
equal a queue that prefills whole and `generate` on each prompt alone; the running rows' rounds run between the
chunks (recorded from the model's own passes); a caller who leaves while its prompt is computed ends at once; rows
keep joining in order."""

from __future__ import annotations

import pytest
import torch
from decoder_models import native_only, prompt, tiny_llama
from live_sources import ArrivingSource

from assisted_backends.api.generation import AssistedGenerator, generate, generate_queue
from assisted_backends.api.prefix import PREFILL_CHUNK, prefill_chunk
from assisted_backends.api.queue import generate_live
from assisted_backends.options.errors import OptionError

pytestmark = pytest.mark.usefixtures("one_thread")
NEW = 10
CHUNK = 8
LENGTHS = (5, 41, 9, 57, 23, 6, 66)  # long prompts join while short ones run


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return tiny_llama(str(tmp_path_factory.mktemp("chunked-prefill")))[1]


def prompts() -> list[list[int]]:
    return [prompt(length, 40 + i)[0].tolist() for i, length in enumerate(LENGTHS)]


def queue(model, chunk: int, **arguments):
    return generate_queue(model, prompts(), slots=2, max_new_tokens=NEW, pad_token_id=0, prefix_cache=False,
                          prefill_chunk=chunk, **arguments)  # fmt: skip


@native_only
@pytest.mark.parametrize(
    "drafting", [{}, {"assistant_early_exit": 1, "num_assistant_tokens": 3}, {"prompt_lookup_num_tokens": 3}],
    ids=["plain", "early-exit", "lookup"],
)  # fmt: skip
def test_chunked_joins_equal_whole_joins_and_each_prompt_alone(native, drafting):
    chunked, whole = queue(native, CHUNK, logprobs=3, **drafting), queue(native, 0, logprobs=3, **drafting)
    assert [t.tolist() for t in chunked.tokens] == [t.tolist() for t in whole.tokens]
    for a, b in zip(chunked.logprobs, whole.logprobs, strict=True):  # the chosen tokens' and the top 3: same bits
        for part in ("tokens", "logprobs", "top_ids", "top_logprobs"):
            assert torch.equal(getattr(a, part), getattr(b, part)), part
    for ids, tokens in zip(prompts(), chunked.tokens):
        alone = generate(native, torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                         prefix_cache=False)  # fmt: skip
        assert tokens.tolist() == alone.sequences[0, len(ids) :].tolist()


@native_only
def test_running_rows_take_rounds_between_the_chunks(native):
    """The model's passes, in order: a long joining prompt's chunks (one row, CHUNK columns) each followed by a round
    of the running rows, never two chunks back to back; whole (prefill_chunk=0) its pass is one."""
    def passes(chunk: int) -> list[tuple[int, int]]:
        shapes = []
        hook = native.register_forward_pre_hook(
            lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
        )
        try:
            queue(native, chunk)
        finally:
            hook.remove()
        return shapes

    chunked = passes(CHUNK)
    chunks = [i for i, shape in enumerate(chunked) if shape == (1, CHUNK)]
    assert len(chunks) >= 10  # 41, 57 and 66 tokens joined while rows ran (the rest once none ran: one pass)
    assert all(later - earlier > 1 for earlier, later in zip(chunks, chunks[1:]))  # a round between any two
    assert not [shape for shape in passes(0) if shape == (1, CHUNK)]


@native_only
def test_a_live_caller_who_leaves_while_its_prompt_is_computed_ends_and_rows_join_in_order(native):
    lengths = (6, 7, 70, 9, 12)
    ids = [prompt(length, 60 + i)[0].tolist() for i, length in enumerate(lengths)]
    limits = [24, 24, 8, 5, 5]
    source = ArrivingSource(ids, limits, arrive_after=[0, 0, 3, 3, 3], cancel_at={2: 0})  # 2: left at once
    finished = {}
    generate_live(AssistedGenerator(native, prefix_cache=False), source, 3, 256,
                  lambda i, t: finished.setdefault(i, t.tolist()), do_sample=False, pad_token_id=0,
                  prefill_chunk=CHUNK)  # fmt: skip
    assert sorted(finished) == list(range(5))
    assert len(finished[2]) <= 1  # it joined (rows join in order) and ended at its first token
    for i in (0, 1, 3, 4):
        alone = generate(native, torch.tensor([ids[i]]), max_new_tokens=limits[i], do_sample=False, pad_token_id=0,
                         prefix_cache=False)  # fmt: skip
        assert finished[i] == alone.sequences[0, lengths[i] :].tolist()


@native_only
def test_the_chunk_is_on_where_exact_and_a_bad_value_is_one_error(native):
    assert prefill_chunk(None, native) == PREFILL_CHUNK
    assert prefill_chunk(None, torch.nn.Linear(2, 2)) is None  # transformers' modeling: whole unless asked
    assert prefill_chunk(0, native) is None and prefill_chunk(64, torch.nn.Linear(2, 2)) == 64
    with pytest.raises(OptionError, match="prefill_chunk"):
        prefill_chunk(-1, native)

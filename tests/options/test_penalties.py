"""OpenAI's presence / frequency penalties (`options.penalties`): the arithmetic on a hand-made prefix, and, on the
demo target, greedy decoding with the processor equal to transformers' `model.generate` with it, plain and
assisted (prompt lookup, suffix decoding, a live queue whose row 0 has no penalty), and different from decoding
without it."""

from __future__ import annotations

import pytest
import torch
from eagle_fixtures import demo_prompts, demo_target
from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from assisted_backends import generate
from assisted_backends.api.generation import AssistedGenerator
from assisted_backends.api.queue import generate_live
from assisted_backends.drafters.suffix import SuffixCache
from assisted_backends.options.penalties import OpenAIPenaltiesLogitsProcessor, penalty_processors

pytestmark = pytest.mark.usefixtures("one_thread")
NEW = 40


def test_counts_only_the_answers_tokens():
    ids = torch.tensor([[5, 6, 5, 5, 7]])  # a prompt of 2 tokens (5 is in it too), then 5, 5, 7
    scores = torch.zeros(1, 10)
    out = OpenAIPenaltiesLogitsProcessor(0.5, 0.25, prompt_length=2)(ids, scores)
    expected = torch.zeros(1, 10)
    expected[0, 5] = -(0.5 + 2 * 0.25)
    expected[0, 7] = -(0.5 + 0.25)
    assert torch.equal(out, expected) and torch.equal(scores, torch.zeros(1, 10))
    assert torch.equal(OpenAIPenaltiesLogitsProcessor(1.0, 1.0, 5)(ids, scores), scores)  # nothing generated yet


def test_neutral_values_build_nothing_and_out_of_range_is_refused():
    assert penalty_processors(0.0, 0.0, 1.0, 4) == []
    kinds = [type(p) for p in penalty_processors(0.5, 0.0, 1.2, 4)]
    assert kinds == [RepetitionPenaltyLogitsProcessor, OpenAIPenaltiesLogitsProcessor]
    with pytest.raises(ValueError, match="presence: 2.5"):
        OpenAIPenaltiesLogitsProcessor(2.5, 0.0, 3)
    with pytest.raises(ValueError, match="prompt_length"):
        OpenAIPenaltiesLogitsProcessor(0.0, 1.0, -1)


def _prompt() -> torch.Tensor:
    return torch.tensor([demo_prompts(1, 48, seed=3)[0]])


def _transformers(prompt: torch.Tensor, processor, **options) -> torch.Tensor:
    target, _ = demo_target()
    processors = LogitsProcessorList([processor] if processor is not None else [])
    out = target.generate(prompt, max_new_tokens=NEW, do_sample=False, logits_processor=processors, pad_token_id=0,
                          **options)  # fmt: skip
    return out[0, prompt.shape[1] :]


def test_greedy_with_penalties_is_transformers_plain_and_assisted():
    target, _ = demo_target()
    prompt = _prompt()
    penalty = OpenAIPenaltiesLogitsProcessor(0.6, 0.4, prompt.shape[1])
    expected = _transformers(prompt, penalty, min_new_tokens=NEW)
    assert not torch.equal(expected, _transformers(prompt, None, min_new_tokens=NEW))  # the penalty changes the answer
    options = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, logits_processor=[penalty], pad_token_id=0)
    plain = generate(target, prompt, **options)
    assert torch.equal(plain.sequences[0, prompt.shape[1] :], expected)
    lookup = generate(target, prompt, prompt_lookup_num_tokens=6, **options)
    assert torch.equal(lookup.sequences[0, prompt.shape[1] :], expected)
    cache = SuffixCache()
    cache.add(prompt[0].tolist() + expected.tolist())  # an earlier identical request: suffix decoding drafts it
    suffix = generate(target, prompt, suffix_cache=cache, num_assistant_tokens=6, **options)
    assert torch.equal(suffix.sequences[0, prompt.shape[1] :], expected)
    assert suffix.stats.accepted >= NEW // 2  # speculation did run, through the penalised positions


class _Two:
    """A live source of two prompts: row 0 without penalties, row 1 with them (its own processors)."""

    def __init__(self, prompts, own):
        self.prompts, self.own, self.taken = prompts, own, 0

    def pending(self) -> int:
        return len(self.prompts) - self.taken

    def take(self):
        i, self.taken = self.taken, self.taken + 1
        return i, self.prompts[i], NEW, self.own[i]

    def cancelled(self) -> list[int]:
        return []


@pytest.mark.parametrize("lookup", [None, 6])
def test_a_queue_row_of_its_own_penalties_is_transformers(lookup):
    target, _ = demo_target()
    first, second = (torch.tensor(p) for p in demo_prompts(2, 40, seed=5))
    penalty = OpenAIPenaltiesLogitsProcessor(0.0, 0.8, second.shape[0])
    repetition = RepetitionPenaltyLogitsProcessor(1.3)
    finished = {}
    source = _Two([first, second], [[], [repetition, penalty]])
    drafting = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    generate_live(
        AssistedGenerator(target), source, 2, 256, lambda i, t: finished.setdefault(i, t), pad_token_id=0, **drafting
    )  # no processor of the call's own: row 0 has none, row 1 its penalties
    assert torch.equal(finished[0], _transformers(first[None], None))
    out = target.generate(second[None], max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                          logits_processor=LogitsProcessorList([repetition, penalty]))  # fmt: skip
    assert torch.equal(finished[1], out[0, second.shape[0] :])
    assert not torch.equal(finished[1], _transformers(second[None], None))

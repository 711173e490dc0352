"""Prompt lookup drafting: proposals copied from the context, verified like any other draft."""

import pytest
import torch
from stats_tools import NEW, PROMPT, V, assert_same_distribution, exact_joint, sample_counts
from tiny_models import random_prompt, reference_greedy, tiny_model
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper

from assisted_backends import generate
from assisted_backends.drafters.prompt_lookup import lookup

pytestmark = pytest.mark.usefixtures("one_thread")


def test_lookup_takes_the_latest_longest_match():
    ids = torch.tensor([5, 1, 2, 7, 8, 1, 2, 9, 4, 3, 1, 2])
    assert lookup(ids, max_ngram=3, count=3).tolist() == [9, 4, 3]  # latest "1 2", not the first
    ids = torch.tensor([4, 1, 2, 6, 0, 2, 5, 3, 1, 2])
    assert lookup(ids, max_ngram=2, count=2).tolist() == [6, 0]  # the bigram beats the later unigram "2"
    assert lookup(ids, max_ngram=1, count=2).tolist() == [5, 3]  # unigram only: the latest "2"
    assert lookup(torch.tensor([1, 2, 1]), max_ngram=3, count=5).tolist() == [2, 1]  # clipped at the end
    assert lookup(torch.tensor([1, 2, 3]), max_ngram=3, count=4).tolist() == []  # no match
    assert lookup(torch.tensor([7]), max_ngram=3, count=4).tolist() == []
    assert lookup(ids, max_ngram=2, count=2, min_ngram=2).tolist() == [6, 0]
    assert lookup(torch.tensor([5, 1, 2, 9, 8, 2]), max_ngram=3, count=2, min_ngram=2).tolist() == []  # "2" alone


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("static_shapes", [False, True])
def test_greedy_identity(arch, static_shapes, one_token_matches):
    target = tiny_model(arch, seed=0)
    drafted = accepted = 0
    for seed in range(4):
        base = random_prompt(6, seed)
        prompt = torch.cat([base, base, base[:, :3]], dim=1)  # repeats give the lookup something to find
        expected = reference_greedy(target, prompt, 30)
        result = generate(  # constant γ: the adaptive one depends on wall times, and the count below on γ
            target,
            prompt,
            prompt_lookup_num_tokens=4,
            max_new_tokens=30,
            static_shapes=static_shapes,
            schedule="constant",
        )
        assert torch.equal(result.sequences, expected)
        assert result.stats.drafter == "prompt_lookup"
        assert result.stats.draft_forwards == 0
        if static_shapes:
            assert result.stats.drafted == 4 * result.stats.rounds
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert drafted > 0 and accepted > 0, "the repeats must produce accepted lookups"


def test_prompt_lookup_num_tokens_sets_the_draft_length():
    target = tiny_model("llama", seed=0)
    prompt = torch.arange(20)[None].repeat(1, 3)
    result = generate(target, prompt, prompt_lookup_num_tokens=7, max_new_tokens=16, static_shapes=True)
    assert len(result.stats.per_position_drafted) == 7


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_prompt_lookup_num_tokens(bad):
    target = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens must be an integer >= 1"):
        generate(target, torch.tensor([[1, 2]]), prompt_lookup_num_tokens=bad, max_new_tokens=2)


def test_prompt_lookup_and_a_draft_model_are_exclusive():
    target = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="choose one way of drafting"):
        generate(target, torch.tensor([[1, 2]]), assistant_model=target, prompt_lookup_num_tokens=2, max_new_tokens=2)


@pytest.mark.slow
def test_sampling_with_prompt_lookup_matches_plain_sampling():
    """Same exact-enumeration chi-square test as tests/engine/test_lossless_sampling.py (false alarms ≤ 1e-3):
    q is a point mass, so each lookup token is accepted with probability p(x)."""
    target = tiny_model("llama", seed=0, vocab=V, init=0.15)
    counts, acceptance = sample_counts(
        lambda seed: generate(
            target, PROMPT, prompt_lookup_num_tokens=3, max_new_tokens=NEW, do_sample=True, seed=seed
        ),
        2500,
    )
    assert 0.1 < acceptance < 0.9, "lookups must be both accepted and rejected for this test to mean anything"
    assert_same_distribution(
        counts,
        exact_joint(target, LogitsProcessorList([TemperatureLogitsWarper(1.0)])),
        other=exact_joint(target, LogitsProcessorList([TemperatureLogitsWarper(1.5)])),
    )


def test_adaptive_schedule_drives_prompt_lookup_up_to_its_token_count(one_token_matches):
    """Without num_assistant_tokens the adaptive schedule chooses γ ≤ prompt_lookup_num_tokens (it starts
    with plain rounds to measure the target); num_assistant_tokens or schedule='constant' fix γ at the
    lookup's count, as transformers uses it."""
    target = tiny_model("llama", seed=0)
    prompt = torch.arange(20)[None].repeat(1, 3)
    expected = reference_greedy(target, prompt, 24)
    adaptive = generate(target, prompt, prompt_lookup_num_tokens=5, max_new_tokens=24)
    assert adaptive.stats.schedule == "AdaptiveSchedule"
    assert torch.equal(adaptive.sequences, expected)
    assert adaptive.stats.drafted < 5 * adaptive.stats.rounds  # γ varies (3 while exploring)
    assert len(adaptive.stats.per_position_drafted) <= 5
    for fixed in (dict(num_assistant_tokens=2), dict(schedule="constant")):
        constant = generate(target, prompt, prompt_lookup_num_tokens=5, max_new_tokens=24, **fixed)
        assert constant.stats.schedule == "ConstantSchedule"
        assert torch.equal(constant.sequences, expected)
        assert max(i + 1 for i, n in enumerate(constant.stats.per_position_drafted) if n) == 5


def test_the_drafter_needs_a_two_token_match_by_default():
    """A lone repeated token ("2" below) proposes nothing; the bigram "1 2" proposes what followed it."""
    from assisted_backends.drafters.prompt_lookup import PromptLookupDrafter
    from assisted_backends.engine.sampling import SamplingConfig, TokenSelector
    from assisted_backends.engine.slots import Slots

    def proposed(ids: list[int]) -> list[int]:
        slots = Slots(torch.tensor([ids]), len(ids) + 8, 0, [0], 0)
        count = PromptLookupDrafter(vocab_size=16).propose(slots, 3, TokenSelector(SamplingConfig()), None).count
        return slots.ids[0, len(ids) : len(ids) + count].tolist()

    assert proposed([5, 7, 2, 9, 8, 2]) == []
    assert proposed([5, 1, 2, 9, 8, 1, 2]) == [9, 8, 1]

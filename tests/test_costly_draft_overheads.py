"""What trying speculation costs with a draft that cannot pay (issue 15: Gemma 3 270M drafted by
SmolLM2-135M across tokenizers was 1.14-1.27x slower than plain with the adaptive schedule).
Each test pins one removed cost by behaviour, not by timing."""

import pytest
import torch
from any_draft_fixtures import saved_tokenizers
from tiny_models import reference_greedy, tiny_model

from assisted_backends import drafting, generate
from assisted_backends.core.schedule import AdaptiveSchedule, RoundObservation
from assisted_backends.core.translating_drafter import DEFAULT_PREFILL_WINDOW

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    return saved_tokenizers(tmp_path_factory.mktemp("any_draft"))


class _NoVocab:
    """A tokenizer whose full vocabulary must not be built (get_vocab of a 262k vocabulary took 1.4 s per call)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def get_vocab(self):
        raise AssertionError("get_vocab() called although the sizes already differ")


def test_vocabularies_of_different_sizes_need_translation_without_building_them():
    target = tiny_model("llama", seed=0, vocab=96)
    draft = tiny_model("llama", seed=1, vocab=64)
    spec = drafting.DraftSpec(assistant_model=draft, tokenizer=_NoVocab(96), assistant_tokenizer=_NoVocab(64))
    assert drafting.needs_translation(spec, target)


def test_draft_of_another_tokenizer_reads_only_a_window_of_a_long_prompt(tokenizers):
    """Its first pass covers the last DEFAULT_PREFILL_WINDOW target tokens, not the whole prompt; output unchanged."""
    target_tokenizer, draft_tokenizer = tokenizers
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer), max_positions=512)
    draft = tiny_model("gpt2", seed=1, vocab=len(draft_tokenizer), hidden=32, layers=1, max_positions=512)
    text = " ".join(f"word{i} and the quick brown fox {i * 7}" for i in range(20))
    ids = target_tokenizer(text, return_tensors="pt").input_ids
    full_draft_length = len(draft_tokenizer(text).input_ids)
    assert ids.shape[1] > 3 * DEFAULT_PREFILL_WINDOW and full_draft_length > 3 * DEFAULT_PREFILL_WINDOW
    lengths = []
    hook = draft.register_forward_pre_hook(
        lambda m, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        result = generate(
            target,
            ids,
            assistant_model=draft,
            tokenizer=target_tokenizer,
            assistant_tokenizer=draft_tokenizer,
            max_new_tokens=8,
            num_assistant_tokens=2,
        )
    finally:
        hook.remove()
    assert torch.equal(result.sequences, reference_greedy(target, ids, 8))
    assert lengths and max(lengths) <= 3 * DEFAULT_PREFILL_WINDOW, lengths[:3]


def test_costly_probes_run_rarely_enough_to_stay_within_the_budget():
    """A probe whose draft work costs 3 plain rounds (a deep draft catching up on the plain rounds) must be
    spaced ≥ 3 / 2% = 150 rounds apart, not capped at a few dozen rounds (which cost 10% here)."""
    schedule = AdaptiveSchedule(max_gamma=8)
    for _ in range(40):
        gamma = schedule.draft_length()
        schedule.update(RoundObservation(gamma, 0, 3.0 * gamma, 1.0))
    assert schedule.probe_interval() >= 150
    assert schedule.chosen[5:].count(1) <= 1


@pytest.mark.parametrize("cost_prior,explored", [(None, 3), (0.05, 3), (0.4, 1), (0.6, 1)])
def test_exploration_drafts_one_token_with_a_costly_draft(cost_prior, explored):
    """After the two plain rounds the first speculative round drafts 3 tokens, or 1 when the draft has
    ≥ 25% of the target's parameters (early exit at 12 of 30 layers, SmolLM2 drafting for Gemma 3)."""
    schedule = AdaptiveSchedule(max_gamma=8, cost_prior=cost_prior)
    for _ in range(2):
        assert schedule.draft_length() == 0
        schedule.update(RoundObservation(0, 0, 0.0, 1.0))
    assert schedule.draft_length() == explored


def test_a_cheap_draft_of_another_tokenizer_reads_the_whole_prompt(tokenizers):
    """Below 10% of the target's parameters the draft's prompt pass costs little: no window."""
    target_tokenizer, draft_tokenizer = tokenizers
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer), max_positions=512, hidden=256, layers=4)
    draft = tiny_model("gpt2", seed=1, vocab=len(draft_tokenizer), hidden=16, layers=1, max_positions=512)
    assert drafting.parameter_ratio(drafting.DraftSpec(assistant_model=draft), target) < drafting.CHEAP_DRAFT_RATIO
    text = " ".join(f"word{i} and the quick brown fox {i * 7}" for i in range(20))
    ids = target_tokenizer(text, return_tensors="pt").input_ids
    lengths = []
    hook = draft.register_forward_pre_hook(
        lambda m, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        generate(
            target,
            ids,
            assistant_model=draft,
            tokenizer=target_tokenizer,
            assistant_tokenizer=draft_tokenizer,
            max_new_tokens=4,
            num_assistant_tokens=2,
        )
    finally:
        hook.remove()
    assert lengths[0] >= len(draft_tokenizer(text).input_ids) - 2


def test_a_free_drafter_speculates_from_the_first_round():
    """Prompt lookup (cost prior 0) needs no plain rounds to measure the target first: a lookup miss is one."""
    schedule = AdaptiveSchedule(max_gamma=10, cost_prior=0.0)
    assert schedule.draft_length() == 10  # the full lookup: its regimes need depth to be told apart
    assert AdaptiveSchedule(max_gamma=10, cost_prior=0.05).draft_length() == 0
    target = tiny_model("llama", seed=0)
    prompt = torch.arange(20)[None].repeat(1, 3)
    assert drafting.parameter_ratio(drafting.DraftSpec(prompt_lookup_num_tokens=5), target) == 0.0
    result = generate(target, prompt, prompt_lookup_num_tokens=5, max_new_tokens=12)
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 12))

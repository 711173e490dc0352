"""What trying speculation costs with a draft that cannot pay (docs/design.md rule 10: Gemma 3 270M drafted by
SmolLM2-135M across tokenizers was 1.14-1.27x slower than plain with the adaptive schedule).
Each test pins one removed cost by behaviour, not by timing."""

import pytest
import torch
from any_draft_fixtures import saved_tokenizers
from tiny_models import reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.drafters.factory import drafting_request, plan_drafting
from assisted_backends.engine.schedule import AdaptiveSchedule, RoundObservation
from assisted_backends.model_facts import ModelFacts

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


def _plan(target, draft=None, tokenizer=None, assistant_tokenizer=None, lookup_tokens=None, exit_layers=None):
    """The drafting part of a call's plan (`drafters.factory.plan_drafting`)."""
    draft_facts = ModelFacts.of(draft) if draft is not None else None
    request = drafting_request(draft, lookup_tokens, exit_layers)
    return plan_drafting(ModelFacts.of(target), request, draft, draft_facts, tokenizer, assistant_tokenizer)


def test_vocabularies_of_different_sizes_need_translation_without_building_them():
    target = tiny_model("llama", seed=0, vocab=96)
    draft = tiny_model("llama", seed=1, vocab=64)
    spec = _plan(target, draft, tokenizer=_NoVocab(96), assistant_tokenizer=_NoVocab(64))
    assert spec.kind == "translated"


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


def _first_pass_lengths(target, draft, ids, tokenizers, **options) -> tuple[torch.Tensor, list[int]]:
    """(sequences, the draft's forward lengths) of one generate call with a draft of another tokenizer."""
    target_tokenizer, draft_tokenizer = tokenizers
    lengths: list[int] = []
    hook = draft.register_forward_pre_hook(
        lambda m, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        result = generate(
            target, ids, assistant_model=draft, tokenizer=target_tokenizer, assistant_tokenizer=draft_tokenizer,
            **options,
        )  # fmt: skip
    finally:
        hook.remove()
    return result.sequences, lengths


def test_a_costly_draft_of_another_tokenizer_reads_the_whole_prompt(tokenizers):
    """Its first pass covers the whole prompt (a window of the last tokens hid the passage of a summarize
    task: α 0.13 instead of 0.88 on Gemma 3 + SmolLM2); output unchanged."""
    target_tokenizer, draft_tokenizer = tokenizers
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer), max_positions=512)
    draft = tiny_model("gpt2", seed=1, vocab=len(draft_tokenizer), hidden=32, layers=1, max_positions=512)
    assert _plan(target, draft, target_tokenizer, draft_tokenizer).cost_ratio > 0.25  # costly
    text = " ".join(f"word{i} and the quick brown fox {i * 7}" for i in range(20))
    ids = target_tokenizer(text, return_tensors="pt").input_ids
    sequences, lengths = _first_pass_lengths(
        target, draft, ids, tokenizers, max_new_tokens=8, num_assistant_tokens=2
    )  # fmt: skip
    assert torch.equal(sequences, reference_greedy(target, ids, 8))
    assert lengths and lengths[0] >= len(draft_tokenizer(text).input_ids) - 2, lengths[:3]


def _plain_rounds(schedule: AdaptiveSchedule, prefill_s: float, rounds: int = 2) -> None:
    schedule.observe_prefill(prefill_s)
    for _ in range(rounds):
        assert schedule.draft_length() == 0
        schedule.update(RoundObservation(0, 0, 0.0, 1.0))  # t_v(1) = 1 s


@pytest.mark.parametrize("horizon,tried", [(64, False), (1000, True), (None, True)])
def test_a_draft_whose_try_exceeds_the_budget_is_never_tried(horizon, tried):
    """Gemma 3 270M with SmolLM2-135M, in units of t_v(1): the draft's prompt pass ≈ the target's (5 steps
    here), exploration 1 × c = 0.5: 5.5 steps; 2% of the 61 plain steps left is 1.2, of 997 it is 19.9."""
    schedule = AdaptiveSchedule(max_gamma=8, cost_prior=0.5, horizon=horizon, prompt_pass_prior=1.0)
    _plain_rounds(schedule, prefill_s=5.0)
    assert schedule.trial_cost() == pytest.approx(5.5)
    chosen = [schedule.draft_length() for _ in range(20)]
    assert chosen[0] == (1 if tried else 0)
    assert schedule.declined is not tried
    if not tried:
        assert chosen == [0] * 20  # declined for good: no probes either


def test_the_trial_budget_is_two_percent_of_the_plain_time_left():
    """The boundary: a try costing 1.4 t_v(1) is made with 71 tokens left (budget 1.42), not with 69 (1.38)."""
    for left, tried in [(71, True), (69, False)]:
        schedule = AdaptiveSchedule(max_gamma=8, cost_prior=0.3, horizon=left + 3, prompt_pass_prior=0.5)
        _plain_rounds(schedule, prefill_s=2.2)  # 0.5 × 2.2 + 1 × 0.3 × 1.0 = 1.4
        assert (schedule.draft_length() > 0) is tried, left


def test_a_short_answer_never_runs_a_costly_draft(tokenizers):
    """Six new tokens: after the two plain rounds three are left, whose plain time (3 t_v(1)) cannot pay for
    even one draft step of a draft with a third of the target's parameters: the draft never runs."""
    target_tokenizer, draft_tokenizer = tokenizers
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer), max_positions=512)
    draft = tiny_model("gpt2", seed=1, vocab=len(draft_tokenizer), hidden=32, layers=1, max_positions=512)
    ids = target_tokenizer("the quick brown fox jumps over the lazy dog", return_tensors="pt").input_ids
    sequences, lengths = _first_pass_lengths(target, draft, ids, tokenizers, max_new_tokens=6)
    assert torch.equal(sequences, reference_greedy(target, ids, 6))
    assert lengths == []


def test_prompt_pass_ratio_counts_the_body_without_embeddings_and_head():
    """A prompt pass runs the head once: a target that is mostly embeddings (Gemma 3 270M: 62%) costs no
    more to read a prompt than a draft of half its parameters. Drafters that read no prompt: 0."""
    target = tiny_model("llama", seed=0, hidden=64, layers=2, vocab=4096)  # untied embeddings and head
    draft = tiny_model("llama", seed=1, hidden=64, layers=2, vocab=256)
    body = ModelFacts.of(target).body_parameters
    embeddings = target.get_input_embeddings().weight.numel() + target.get_output_embeddings().weight.numel()
    assert body == ModelFacts.of(target).parameters - embeddings
    assert ModelFacts.of(draft).body_parameters == body  # same layers, smaller vocabulary
    spec = _plan(target, draft, tokenizer=_NoVocab(4096), assistant_tokenizer=_NoVocab(256))
    assert spec.cost_ratio < 0.2 and spec.prompt_pass_ratio == 1.0
    assert _plan(target, exit_layers=1).prompt_pass_ratio == 0.0
    assert _plan(target, lookup_tokens=3).prompt_pass_ratio == 0.0


def test_a_free_drafter_speculates_from_the_first_round():
    """Prompt lookup (cost prior 0) needs no plain rounds to measure the target first: a lookup miss is one."""
    schedule = AdaptiveSchedule(max_gamma=10, cost_prior=0.0)
    assert schedule.draft_length() == 10  # the full lookup: its regimes need depth to be told apart
    assert AdaptiveSchedule(max_gamma=10, cost_prior=0.05).draft_length() == 0
    target = tiny_model("llama", seed=0)
    prompt = torch.arange(20)[None].repeat(1, 3)
    assert _plan(target, lookup_tokens=5).cost_ratio == 0.0
    result = generate(target, prompt, prompt_lookup_num_tokens=5, max_new_tokens=12)
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 12))

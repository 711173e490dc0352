"""Statistics report what they say (docs/design.md rule 6)."""

import pytest
from tiny_models import noisy_copy, random_prompt, tiny_model

from assisted_backends import generate


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


def test_target_as_its_own_draft_accepts_everything(target):
    result = generate(
        target, random_prompt(5, seed=1), assistant_model=target, max_new_tokens=21, num_assistant_tokens=4
    )
    stats = result.stats
    assert stats.acceptance_rate == 1.0
    # 1 token from the prefill, then rounds of γ accepted + 1: 20 tokens need 4 rounds of 5.
    assert stats.rounds == 4 and stats.drafted == 16 and stats.accepted == 16
    assert stats.mean_accepted_length == 5.0
    assert stats.per_position_accepted == stats.per_position_drafted == [4, 4, 4, 4]
    assert stats.target_forwards == 1 + stats.rounds
    assert stats.draft_forwards == 1 + stats.drafted  # prefill + one forward per drafted token


def test_counts_add_up_with_partial_acceptance(target):
    draft = noisy_copy(target, seed=3, scale=0.02)
    result = generate(
        target, random_prompt(5, seed=2), assistant_model=draft, max_new_tokens=40, num_assistant_tokens=3
    )
    stats = result.stats
    assert stats.new_tokens == 40 == result.sequences.shape[1] - 5
    assert sum(stats.per_position_accepted) == stats.accepted
    assert sum(stats.per_position_drafted) == stats.drafted
    assert all(a <= d for a, d in zip(stats.per_position_accepted, stats.per_position_drafted))
    # Acceptance is a prefix: position i+1 can only be accepted where position i was.
    assert stats.per_position_accepted == sorted(stats.per_position_accepted, reverse=True)
    # Every committed token is the prefill's, an accepted draft, or a round's target token (minus truncation).
    assert stats.new_tokens <= 1 + stats.accepted + stats.rounds
    assert stats.acceptance_rate == pytest.approx(stats.accepted / stats.drafted)
    assert stats.prefill_s > 0 and stats.decode_s > 0
    data = stats.to_dict()
    assert data["acceptance_rate"] == stats.acceptance_rate and data["drafter"] == "draft_model"


def test_plain_decoding_reports_no_acceptance(target):
    stats = generate(target, random_prompt(5, seed=1), max_new_tokens=7).stats
    assert stats.acceptance_rate is None and stats.drafted == 0 and stats.draft_forwards == 0
    assert stats.rounds == 6 and stats.target_forwards == 7 and stats.mean_accepted_length == 1.0

"""The adaptive draft-length schedule: it may pick any γ (0 included) but never changes the tokens."""

import pytest
import torch
from tiny_models import noisy_copy, random_prompt, reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.core.schedule import (
    AdaptiveSchedule,
    ConstantSchedule,
    RoundObservation,
    expected_tokens,
    leviathan_speedup,
    make_schedule,
)


def _drive(schedule: AdaptiveSchedule, alpha: float, t_draft: float, t_target: float, rounds: int, seed: int = 0):
    """Simulate rounds: each draft token accepted with probability α; costs as given."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        gamma = schedule.draft_length()
        accepted = 0
        while accepted < gamma and torch.rand((), generator=generator).item() < alpha:
            accepted += 1
        schedule.update(RoundObservation(gamma, accepted, gamma * t_draft, t_target))
    return schedule.chosen


def test_formula_values():
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert leviathan_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))


def test_good_cheap_draft_speculates_deeply():
    chosen = _drive(AdaptiveSchedule(max_gamma=8), alpha=0.9, t_draft=0.05, t_target=1.0, rounds=60)
    assert min(chosen[10:]) >= 4


def test_useless_draft_turns_speculation_off_and_probes():
    schedule = AdaptiveSchedule(max_gamma=8)
    chosen = _drive(schedule, alpha=0.0, t_draft=0.3, t_target=1.0, rounds=100)
    tail = chosen[10:]
    assert tail.count(0) >= 0.9 * len(tail)
    assert 1 in tail, "it must probe now and then"


def test_draft_as_costly_as_the_target_stays_plain():
    """α = 1 but c = 1 and verification costs more than one step: speculation cannot win."""
    schedule = AdaptiveSchedule(max_gamma=8)
    generator_rounds = 40
    for _ in range(generator_rounds):
        gamma = schedule.draft_length()
        schedule.update(RoundObservation(gamma, gamma, gamma * 1.0, 1.0 + 0.2 * gamma))
    assert schedule.chosen[5:].count(0) >= 0.9 * len(schedule.chosen[5:])


def test_a_draft_as_large_as_the_target_is_never_tried():
    schedule = AdaptiveSchedule(max_gamma=8, cost_prior=1.0)
    assert _drive(schedule, alpha=1.0, t_draft=1.0, t_target=1.0, rounds=20) == [0] * 20


def test_probe_interval_follows_the_probe_cost():
    cheap, costly = AdaptiveSchedule(), AdaptiveSchedule()
    _drive(cheap, alpha=0.0, t_draft=0.02, t_target=1.0, rounds=5)
    _drive(costly, alpha=0.0, t_draft=0.5, t_target=1.0, rounds=5)
    assert cheap.probe_interval() < costly.probe_interval() <= costly.max_probe_interval


def test_make_schedule_rules():
    assert isinstance(make_schedule(None, None, False, 4, 8), AdaptiveSchedule)
    assert make_schedule(None, 3, False, 4, 8).gamma == 3
    assert make_schedule(None, None, True, 4, 8).gamma == 4
    assert make_schedule("adaptive", 5, False, 4, 8).max_gamma == 5
    with pytest.raises(ValueError, match="static shapes forbid"):
        make_schedule("adaptive", None, True, 4, 8)
    with pytest.raises(ValueError, match="schedule='fast' is not one of"):
        make_schedule("fast", None, False, 4, 8)
    with pytest.raises(ValueError, match="num_assistant_tokens must be >= 1"):
        ConstantSchedule(0)


@pytest.mark.parametrize("draft_kind", ["self", "unrelated", "noisy"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_adaptive_schedule_keeps_greedy_identity(arch, draft_kind):
    target = tiny_model(arch, seed=0)
    draft = {"self": target, "unrelated": tiny_model(arch, seed=1), "noisy": noisy_copy(target, 3, 0.02)}[draft_kind]
    prompt = random_prompt(9, seed=4)
    result = generate(target, prompt, assistant_model=draft, max_new_tokens=40, schedule="adaptive")
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 40))
    assert result.stats.schedule == "AdaptiveSchedule"


def test_adaptive_is_the_default_without_num_assistant_tokens():
    target = tiny_model("llama", seed=0)
    result = generate(target, random_prompt(4, seed=1), assistant_model=target, max_new_tokens=10)
    assert result.stats.schedule == "AdaptiveSchedule"

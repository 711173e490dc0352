"""The adaptive draft-length schedule: it may pick any γ (0 included) but never changes the tokens."""

import pytest
import torch
from tiny_models import noisy_copy, random_prompt, reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.engine.schedule import (
    AdaptiveSchedule,
    RoundObservation,
    ScheduleChoice,
    SourceSchedule,
    _PositionAcceptance,
    _VerifyCost,
    choose_schedule,
    expected_tokens,
    leviathan_speedup,
)


def _drive(
    schedule: AdaptiveSchedule,
    alpha: float | list[float],
    t_draft: float,
    t_target: float,
    rounds: int,
    seed: int = 0,
    verify_jump: float = 0.0,
):
    """Simulate rounds: draft token i accepted with probability α_i (α for all i); a target pass over q
    tokens costs t_target, plus `verify_jump` when q > 1."""
    rates = alpha if isinstance(alpha, list) else [alpha] * 64
    generator = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        gamma = schedule.draft_length()
        accepted = 0
        while accepted < gamma and torch.rand((), generator=generator).item() < rates[accepted]:
            accepted += 1
        verify = t_target + (verify_jump if gamma > 0 else 0.0)
        schedule.update(RoundObservation(gamma, accepted, gamma * t_draft, verify))
    return schedule.chosen


def _best_gamma(rates: list[float], t_draft: float, t_target: float, verify_jump: float, max_gamma: int) -> int:
    """argmax over γ >= 1 of the true E[tokens](γ) / cost(γ)."""

    def rate(gamma: int) -> float:
        expected, survive = 1.0, 1.0
        for alpha in rates[:gamma]:
            survive *= alpha
            expected += survive
        return expected / (gamma * t_draft + t_target + verify_jump)

    return max(range(1, max_gamma + 1), key=rate)


def test_formula_values():
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert leviathan_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))


def test_good_cheap_draft_speculates_deeply():
    chosen = _drive(AdaptiveSchedule(max_gamma=8), alpha=0.9, t_draft=0.05, t_target=1.0, rounds=60)
    assert min(chosen[10:]) >= 4


def test_correlated_acceptance_is_learned_per_position():
    """α_1 = 0.5 but later tokens are nearly always accepted once the first one is: a single pooled α
    would say "shallow"; the per-position estimate finds the deep optimum."""
    rates = [0.5] + [0.95] * 7
    chosen = _drive(AdaptiveSchedule(max_gamma=8), rates, t_draft=0.05, t_target=1.0, rounds=300, verify_jump=0.3)
    best = _best_gamma(rates, 0.05, 1.0, 0.3, 8)
    assert best >= 6
    tail = sorted(chosen[100:])
    assert abs(tail[len(tail) // 2] - best) <= 1, (best, tail)


def test_a_verify_cost_jump_is_not_extrapolated_linearly():
    """One extra token costs a jump, more tokens nothing (CPU): deep drafts stay worth it."""
    chosen = _drive(AdaptiveSchedule(max_gamma=8), 0.7, t_draft=0.05, t_target=1.0, rounds=200, verify_jump=0.5)
    best = _best_gamma([0.7] * 8, 0.05, 1.0, 0.5, 8)
    tail = sorted(chosen[50:])
    assert best >= 5 and abs(tail[len(tail) // 2] - best) <= 1, (best, tail)


def test_position_acceptance_counts_and_shrinkage():
    acceptance = _PositionAcceptance(max_gamma=3, decay=1.0, prior_weight=2.0)
    assert acceptance.rates() == [0.5, 0.5, 0.5]
    acceptance.update(gamma=3, accepted=1)  # position 1 accepted, position 2 rejected, 3 undecided
    alpha_1 = (1 + 2 * 0.5) / (1 + 2)
    alpha_2 = (0 + 2 * alpha_1) / (1 + 2)
    assert acceptance.rates() == pytest.approx([alpha_1, alpha_2, alpha_2])
    assert acceptance.expected_tokens(2) == pytest.approx(1 + alpha_1 + alpha_1 * alpha_2)
    assert acceptance.expected_tokens(0) == 1.0


def test_verify_cost_interpolates_and_extrapolates_flat():
    verify = _VerifyCost(max_query=9)
    assert verify(3) == 0.0
    verify.add(1, 1.5)  # a first call that paid for warm-up ...
    verify.add(1, 1.0)  # ... is replaced by a lower second sample
    verify.add(5, 3.0)  # q = 5 measured once: its first pass may be inflated ...
    assert verify(5) == 1.0 and verify(9) == 1.0  # ... so it counts as at most the settled estimate
    verify.add(5, 2.0)  # settled
    assert verify(1) == 1.0 and verify(5) == 2.0
    assert verify(3) == pytest.approx(1.5)
    assert verify(9) == 2.0
    assert verify.samples(5) == 2 and verify.samples(3) == 0
    verify.add(7, 1.2)  # one sample below the settled estimate stands
    assert verify(7) == 1.2


def test_one_inflated_first_pass_does_not_end_speculation():
    """Gemma 3 with prompt lookup: the first 3-token pass cost 2.5 plain steps (warm-up), later ones 1.2, and
    the first draft was rejected; half of each later draft is accepted (speculation pays: E ≈ 2 per 1.2)."""
    schedule = AdaptiveSchedule(max_gamma=4, initial=3)
    seen: set[int] = set()
    for _ in range(30):
        gamma = schedule.draft_length()
        verify = 1.0 if gamma == 0 else (1.2 if gamma in seen else 2.5)
        accepted = (gamma + 1) // 2 if seen - {0} else 0
        seen.add(gamma)
        schedule.update(RoundObservation(gamma, accepted, 0.01 * gamma, verify))
    assert schedule.chosen[-10:].count(0) <= 2, schedule.chosen


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


def test_schedule_choice_rules():
    def made(name, gamma, static_shapes, default_gamma, max_gamma, **kwargs):
        choice = ScheduleChoice(name, gamma, default_gamma, max_gamma, static_shapes=static_shapes, **kwargs)
        return choose_schedule(choice).build()

    assert isinstance(made(None, None, False, 4, 8), AdaptiveSchedule)
    assert made(None, 3, False, 4, 8).gamma == 3
    assert made(None, None, True, 4, 8).gamma == 4
    assert made("adaptive", 5, False, 4, 8).max_gamma == 5
    assert made(None, None, False, 4, 8, seeded_sampling=True).gamma == 4
    assert isinstance(made("adaptive", None, False, 4, 8, seeded_sampling=True), AdaptiveSchedule)


def test_schedule_option_rules():
    """The names and combinations are the options layer's rules (`options.ranges`), checked once."""
    from assisted_backends.options import ranges

    with pytest.raises(ValueError, match="static shapes forbid"):
        ranges.check_shapes(None, True, "adaptive", None)
    with pytest.raises(ValueError, match="schedule='fast' is not one of"):
        ranges.check_shapes(None, False, "fast", None)
    with pytest.raises(ValueError, match="num_assistant_tokens must be >= 1"):
        ranges.check_drafting({"num_assistant_tokens": 0})


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


def test_seeded_sampling_defaults_to_a_constant_schedule_and_reproduces_its_tokens():
    target = tiny_model("llama", seed=0)
    draft = noisy_copy(target, 3, 0.05)
    prompt = random_prompt(6, seed=2)
    runs = [
        generate(target, prompt, assistant_model=draft, max_new_tokens=20, do_sample=True, seed=11) for _ in range(2)
    ]
    assert runs[0].stats.schedule == "ConstantSchedule"
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    unseeded = generate(target, prompt, assistant_model=draft, max_new_tokens=5, do_sample=True)
    assert unseeded.stats.schedule == "AdaptiveSchedule"


@pytest.mark.parametrize("accepted_first,explorations", [(0, 1), (2, 2)])
def test_exploration_repeats_only_for_a_draft_that_got_something_right(accepted_first, explorations):
    """Two plain rounds, then γ = initial once; a second time only if the first accepted anything
    (so one warm-up-inflated time cannot end a good draft's speculation, and a useless one costs one round)."""
    schedule = AdaptiveSchedule(max_gamma=8, initial=3)
    useless_costs = dict(draft_s=3 * 0.5, verify_s=2.0)  # after exploring: speculation cannot win
    for _ in range(2):
        assert schedule.draft_length() == 0
        schedule.update(RoundObservation(0, 0, 0.0, 1.0))
    assert schedule.draft_length() == 3
    schedule.update(RoundObservation(3, accepted_first, **useless_costs))
    second = schedule.draft_length()
    assert (second == 3) == (explorations == 2), schedule.chosen


def test_a_batch_whose_verify_pass_is_compute_bound_stops_speculating():
    """Batches: every row adds one acceptance sample per round and the times are the batch's. When verifying
    γ + 1 positions of the batch costs γ + 1 plain steps (compute bound), γ = 0 wins even with a good draft;
    when it costs little more than one step, the same draft is used."""
    generator = torch.Generator().manual_seed(0)

    def run(verify_cost_per_position: float) -> list[int]:
        schedule = AdaptiveSchedule(max_gamma=6, cost_prior=0.1)
        for _ in range(120):
            gamma = schedule.draft_length()
            rows = []
            for _ in range(16):  # 16 rows, α = 0.7 each
                accepted = 0
                while accepted < gamma and torch.rand((), generator=generator).item() < 0.7:
                    accepted += 1
                rows.append(accepted)
            verify = 1.0 + verify_cost_per_position * gamma
            schedule.update(RoundObservation(gamma, sum(rows), gamma * 0.1, verify, tuple(rows)))
        return schedule.chosen

    compute_bound = run(verify_cost_per_position=1.0)  # t_v(q) = q · t_v(1)
    assert sum(gamma > 0 for gamma in compute_bound[-60:]) <= 2, "only the rare γ = 1 probes remain"
    memory_bound = run(verify_cost_per_position=0.05)
    assert min(memory_bound[-60:]) >= 2, "a cheap verify pass keeps a good draft drafting deep"


def test_a_free_drafter_finds_a_copied_span_after_spurious_matches():
    """Prompt lookup (cost prior 0): 15 rounds of spurious matches (x_1 always rejected), then a copied span
    (x_1 accepted 90%, later tokens 95%); every 4th lookup finds nothing (a plain round); a pass over q > 1
    tokens costs 1.5 plain steps. The schedule must
    be drafting deep again within the span, not wait for rare one-token probes."""
    schedule = AdaptiveSchedule(max_gamma=10, cost_prior=0.0)
    generator = torch.Generator().manual_seed(0)
    for round_index in range(60):
        gamma = schedule.draft_length() if round_index % 4 else 0 * schedule.draft_length()  # every 4th: no match
        rates = [0.0] * 10 if round_index < 15 else [0.9] + [0.95] * 9
        accepted = 0
        while accepted < gamma and torch.rand((), generator=generator).item() < rates[accepted]:
            accepted += 1
        schedule.update(RoundObservation(gamma, accepted, 0.0, 1.0 if gamma == 0 else 1.5))
    spurious, copying = schedule.chosen[5:15], schedule.chosen[35:]
    assert spurious.count(0) >= 6, schedule.chosen
    assert sum(gamma >= 5 for gamma in copying) >= 0.8 * len(copying), schedule.chosen


def test_one_inflated_plain_pass_does_not_keep_a_batch_drafting():
    """Prompt lookup over 8 rows deep in a shared prompt (the agent set through the server): the first plain pass
    took 480 ms (a warm-up), later ones 110 ms, a pass over γ + 1 = 9 or 11 tokens per row 600 ms, and one row in
    eight accepts a few tokens. On the single inflated sample the schedule judged plain decoding 4x dearer than it
    is and kept drafting (7 of the first 10 rounds); plain decoding's time is measured again first now."""
    schedule = AdaptiveSchedule(max_gamma=10, cost_prior=0.0)
    schedule.observe_batch(8)
    plain_passes = iter([0.48] + [0.11] * 100)
    for round_index in range(40):
        gamma = schedule.draft_length() if round_index else 0 * schedule.draft_length()  # the first: no match
        rows = (3,) + (0,) * 7 if gamma else (0,) * 8
        verify = next(plain_passes) if gamma == 0 else 0.6
        schedule.update(RoundObservation(gamma, sum(rows), 0.001 * gamma, verify, rows, 8))
    assert sum(gamma > 0 for gamma in schedule.chosen[:10]) <= 3, schedule.chosen  # the exploration rounds
    assert all(gamma == 0 for gamma in schedule.chosen[10:]), schedule.chosen
    assert schedule.verify(1) < 0.12


def test_a_free_drafter_measures_plain_decoding_before_it_compares():
    """Prompt lookup that finds a match in every row from the first round (the code set through the server, 8 rows):
    plain decoding was never measured, so t_v(B) was priced as the narrowest speculative pass (3x a plain one) and
    the batch drafted every round at a loss. Two plain rounds now measure it, and drafting stops."""
    schedule = AdaptiveSchedule(max_gamma=10, cost_prior=0.0)
    schedule.observe_batch(8)
    for _ in range(40):
        gamma = schedule.draft_length()
        rows = (min(gamma, 2),) + (0,) * 7  # one row in eight accepts up to 2 tokens
        schedule.update(RoundObservation(gamma, sum(rows), 0.001 * gamma, 0.03 + 0.01 * gamma * (gamma > 0), rows, 8))
    assert schedule.plain_cost.samples(8) >= 2 and schedule.verify(1) == pytest.approx(0.03)
    assert all(gamma == 0 for gamma in schedule.chosen[10:]), schedule.chosen


def test_plain_passes_are_priced_apart_from_verify_passes_of_the_same_size():
    """The native step at a live batch: a plain pass over 8 rows takes 19 ms, a verify pass over 4 rows of 2 tokens
    (the same M = 8) 32 ms (its attention over several queries is another path). Keyed by M alone the two mixed, so
    plain decoding at 8 rows looked dearer than it is; each now has its own curve, and a verify size never measured
    is priced from the plain curve below the verify passes measured (tried, then priced)."""
    schedule = AdaptiveSchedule(max_gamma=4, cost_prior=0.0)
    rounds = [(2, 0, 0.012), (2, 0, 0.012), (8, 0, 0.019), (8, 0, 0.019), (4, 1, 0.032), (4, 1, 0.032), (8, 0, 0.019)]
    for batch, gamma, seconds in rounds:
        schedule.observe_batch(batch)
        schedule.update(RoundObservation(gamma, 0, 0.0, seconds, (0,) * batch, batch))
    schedule.observe_batch(8)
    assert schedule.verify(1) == pytest.approx(0.019)
    schedule.observe_batch(4)
    assert schedule.verify(2) == pytest.approx(0.032)
    assert schedule.verify(1) == pytest.approx(0.012 + (0.019 - 0.012) * (4 - 2) / (8 - 2))  # plain passes only
    schedule.observe_batch(2)  # M = 4, below every verify pass: between the plain pass at 2 rows and the verify at 8
    assert schedule.verify(2) == pytest.approx(0.012 + (0.032 - 0.012) * (4 - 2) / (8 - 2))


def test_no_probe_when_too_few_tokens_are_left_to_use_what_it_finds():
    """A useless draft: probes every `probe_interval()` plain rounds, but none in the last interval of the
    generation when the schedule knows its horizon (each round here makes one token)."""
    knowing, blind = AdaptiveSchedule(max_gamma=8, horizon=100), AdaptiveSchedule(max_gamma=8)
    for schedule in (knowing, blind):
        _drive(schedule, alpha=0.0, t_draft=0.3, t_target=1.0, rounds=100)
    interval = knowing.probe_interval()
    assert 5 <= interval <= 30
    assert any(gamma > 0 for gamma in knowing.chosen[10:-interval]), "probes still run while tokens are left"
    assert all(gamma == 0 for gamma in knowing.chosen[-interval:]), knowing.chosen
    assert blind.worth_probing() and not knowing.worth_probing(), "only the horizon tells them apart"


def test_probes_that_keep_failing_come_ever_more_rarely():
    """A useless costed draft: each probe that accepts nothing doubles the wait before the next one, so over 2000
    rounds it is asked O(log rounds) times; a probe that accepts brings the wait back to `probe_interval()`."""
    schedule = AdaptiveSchedule(max_gamma=8, max_probe_interval=10_000)
    _drive(schedule, alpha=0.0, t_draft=0.3, t_target=1.0, rounds=2000)
    probes = [i for i, gamma in enumerate(schedule.chosen) if gamma > 0][1:]  # after the exploration round
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert 3 <= len(probes) <= 12, schedule.chosen
    assert all(later >= 2 * earlier - 1 for earlier, later in zip(gaps, gaps[1:])), gaps
    assert schedule.probe_wait() >= 2 * schedule.probe_interval()
    schedule.update(RoundObservation(1, 1, 0.3, 1.0))  # a probe (or any round) that accepts
    assert schedule.probe_wait() == schedule.probe_interval()


def test_a_free_drafter_keeps_probing_at_its_interval():
    """Prompt lookup's regimes change within a few rounds (a copied span starts): failed probes do not back off."""
    free, costed = AdaptiveSchedule(max_gamma=8, cost_prior=0.0), AdaptiveSchedule(max_gamma=8, cost_prior=0.05)
    for schedule in (free, costed):
        _drive(schedule, alpha=0.0, t_draft=0.0, t_target=1.0, rounds=3)
        schedule.failed_probes = 3
    assert free.probe_wait() == free.probe_interval()
    assert costed.probe_wait() == min(costed.max_probe_interval, 8 * costed.probe_interval())


def test_a_known_acceptance_prior_decides_the_rounds_before_the_counts_do():
    """A head whose held-out α_1 is known low (0.05) stops drafting right after its exploration round; with
    the uninformed prior (1/2) the same draft keeps drafting for rounds until its counts outweigh the prior."""
    informed = AdaptiveSchedule(max_gamma=4, acceptance_prior=0.05)
    uninformed = AdaptiveSchedule(max_gamma=4)
    for schedule in (informed, uninformed):
        _drive(schedule, alpha=0.0, t_draft=0.05, t_target=1.0, rounds=12, verify_jump=0.05)
    assert informed.chosen[:3] == [0, 0, 3] == uninformed.chosen[:3]  # two plain rounds, then the exploration
    assert sum(gamma > 0 for gamma in informed.chosen[3:]) <= 1, informed.chosen  # at most one γ = 1 probe
    assert sum(gamma > 0 for gamma in uninformed.chosen[3:]) >= 4, uninformed.chosen
    assert informed.acceptance.rates()[0] < uninformed.acceptance.rates()[0]


def test_each_drafting_source_learns_its_own_acceptance():
    """An EAGLE head with prompt lookup first (`SourceSchedule`): rounds alternate between a lookup source that
    is always right and a head that never is. The head's rounds go plain; the lookup rounds keep drafting deeply.
    One schedule for both would average them and keep the head drafting."""
    head = AdaptiveSchedule(max_gamma=8, cost_prior=0.05, horizon=10_000)
    lookup = AdaptiveSchedule(max_gamma=10, cost_prior=0.0, horizon=10_000)
    turn = iter(range(10_000))
    schedule = SourceSchedule({"head": head, "lookup": lookup}, lambda: "lookup" if next(turn) % 2 else "head")
    for _ in range(200):
        gamma = schedule.draft_length()
        accepted = gamma if schedule.current == "lookup" else 0
        draft_s = 0.0 if schedule.current == "lookup" else 0.05 * gamma
        schedule.update(RoundObservation(gamma, accepted, draft_s, 1.0 + 0.5 * (gamma > 0)))
    head_rounds = [g for source, g in schedule.chosen[40:] if source == "head"]
    lookup_rounds = [g for source, g in schedule.chosen[40:] if source == "lookup"]
    assert head_rounds.count(0) >= 0.85 * len(head_rounds)
    assert min(lookup_rounds) >= 8
    assert head.verify_cost is lookup.verify_cost and head.plain_cost is lookup.plain_cost and head.made == lookup.made

"""The adaptive schedule with a live batch (`engine.schedule`): one γ per round from the verify cost measured
at the current batch size and the rows' acceptance; speculation off where the batch is compute-bound, back
on when rows leave, and never much slower than plain batched decoding at any B.

Simulated rounds with a cost model of a device that is memory-bound for few tokens and compute-bound for
many: a pass feeding M = B·q tokens costs t_v = 1 + 0.1·M (a 16-row batch verifying 4 tokens per row costs
7.4 plain steps of one row, 2.8 of its own plain steps), a draft step over B rows 0.05 + 0.01·B; every row
accepts each draft token with probability α = 0.7.
"""

from __future__ import annotations

import random

from assisted_backends.engine.schedule import AdaptiveSchedule, RoundObservation, _PositionAcceptance

ALPHA = 0.7


def verify_cost(batch: int, query: int) -> float:
    return 1.0 + 0.1 * batch * query


def draft_cost(batch: int) -> float:
    return 0.05 + 0.01 * batch


def simulate(schedule: AdaptiveSchedule, batch: int, rounds: int, rng: random.Random) -> tuple[list[int], float]:
    """`rounds` rounds at `batch` rows: (γ of each round, tokens per second relative to plain decoding)."""
    chosen, tokens, seconds = [], 0, 0.0
    for _ in range(rounds):
        schedule.observe_batch(batch)
        gamma = schedule.draft_length()
        accepted = []
        for _ in range(batch):
            n = 0
            while n < gamma and rng.random() < ALPHA:
                n += 1
            accepted.append(n)
        draft_s, verify_s = gamma * draft_cost(batch), verify_cost(batch, gamma + 1)
        schedule.update(RoundObservation(gamma, sum(accepted), draft_s, verify_s, tuple(accepted), batch))
        chosen.append(gamma)
        tokens += sum(n + 1 for n in accepted)
        seconds += draft_s + verify_s
    plain_rate = batch / verify_cost(batch, 1)
    return chosen, (tokens / seconds) / plain_rate


def test_speculation_stops_when_the_batch_is_compute_bound_and_resumes_when_rows_leave():
    schedule = AdaptiveSchedule(max_gamma=4, cost_prior=0.05, horizon=None)
    rng = random.Random(0)
    full, full_rate = simulate(schedule, 16, 150, rng)
    drained, drained_rate = simulate(schedule, 2, 150, rng)
    assert full[20:].count(0) >= 0.9 * len(full[20:]), full
    assert drained[10:].count(0) <= 0.1 * len(drained[10:]), drained
    assert full_rate >= 0.95, f"at B = 16 the schedule must stay within 5% of plain decoding: {full_rate:.3f}"
    assert drained_rate >= 1.3, f"at B = 2 speculation pays (expected about 1.5x): {drained_rate:.3f}"


def test_a_batch_that_grows_turns_speculation_off_again():
    schedule = AdaptiveSchedule(max_gamma=4, cost_prior=0.05, horizon=None)
    rng = random.Random(1)
    small, _ = simulate(schedule, 2, 100, rng)
    large, large_rate = simulate(schedule, 16, 150, rng)
    assert small[10:].count(0) <= 0.1 * len(small[10:])
    assert large[30:].count(0) >= 0.9 * len(large[30:]), large
    assert large_rate >= 0.95, large_rate


def test_costs_are_kept_by_the_tokens_a_pass_feeds():
    schedule = AdaptiveSchedule(max_gamma=4)
    for gamma in (0, 0, 3, 3):
        schedule.observe_batch(8)
        schedule.update(RoundObservation(gamma, 0, 0.1 * gamma, verify_cost(8, gamma + 1), (0,) * 8, 8))
    schedule.observe_batch(8)
    assert schedule.verify(1) == verify_cost(8, 1) and schedule.verify(4) == verify_cost(8, 4)
    schedule.observe_batch(6)  # two rows left: M = 6·4 = 24 lies between the measured 8 and 32
    assert abs(schedule.verify(4) - verify_cost(6, 4)) < 1e-9
    assert schedule.verify(1) == verify_cost(8, 1), "below the smallest measured M: the nearest one"


def test_a_batch_forgets_once_per_round_not_once_per_row():
    """16 rows accept both tokens, then 16 accept none: the first round still weighs half (decay 0.5 per round);
    decaying once per row would have left it 0.5^16 of its weight (α_1 ≈ 1/18)."""
    batch = _PositionAcceptance(2, decay=0.5, prior_weight=2.0)
    batch.update_rows(2, (2,) * 16)
    batch.update_rows(2, (0,) * 16)
    successes, trials = 0.5 * 16, 0.5 * 16 + 16
    assert abs(batch.rates()[0] - (successes + 2.0 * 0.5) / (trials + 2.0)) < 1e-12


def test_a_round_that_drops_ended_rows_is_priced_without_the_drop(monkeypatch):
    """Dropping rows that ended copies the batch's cache whatever γ (4-5 plain passes at 4 rows in a server): the
    schedule's sample of such a round leaves the drop out. With it in, plain decoding was priced up and a server's
    batch drafted at a loss. Here the drop is made to take 0.3 s; no sample the schedule sees may hold it."""
    import time

    from tiny_models import random_prompt, tiny_model

    from assisted_backends import generate_queue
    from assisted_backends.engine.state import DecodingState

    moves, observed = [], []
    move_rows, update = DecodingState.move_rows, AdaptiveSchedule.update

    def slow_drop(self, move, pad, length):
        if len(move.kept) < self.slots.batch:
            moves.append(len(move.kept))
            time.sleep(0.3)
        move_rows(self, move, pad, length)

    def record(self, observation):
        observed.append(observation)
        update(self, observation)

    monkeypatch.setattr(DecodingState, "move_rows", slow_drop)
    monkeypatch.setattr(AdaptiveSchedule, "update", record)
    target = tiny_model("llama", seed=0)
    prompts = [random_prompt(6, seed=i)[0].repeat(3) for i in range(3)]  # repeats: lookup finds matches
    generate_queue(target, prompts, slots=2, max_new_tokens=12, prompt_lookup_num_tokens=4, pad_token_id=0)
    assert moves, "two rows end together while one prompt waits: one of them leaves the batch"
    assert observed and max(o.verify_s for o in observed) < 0.3

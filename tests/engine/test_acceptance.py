"""The verification step in isolation: greedy prefix matching and lossless rejection sampling."""

import pytest
import torch
from stats_tools import chi_square_p_value

from assisted_backends.engine.acceptance import (
    acceptance_probability,
    greedy_accept,
    residual_distribution,
    speculative_accept,
)

V = 5


def _random_distribution(generator: torch.Generator, zeros: int = 0) -> torch.Tensor:
    weights = torch.rand(V, generator=generator, dtype=torch.float64) + 0.05
    weights[:zeros] = 0.0
    return weights / weights.sum()


def test_greedy_accept_takes_the_longest_matching_prefix_and_the_target_token():
    draft = torch.tensor([[4, 7, 9], [4, 7, 9], [1, 2, 3]])
    target = torch.tensor([[4, 7, 9, 11], [4, 8, 9, 11], [5, 2, 3, 6]])
    n, next_token = greedy_accept(draft, target)
    assert n.tolist() == [3, 1, 0]
    assert next_token.tolist() == [11, 8, 5]


@pytest.mark.parametrize("case", range(20))
def test_one_speculative_step_reproduces_p_exactly(case):
    """Enumerate the draft token x ~ q: P(out = y) = Σ_x q(x) [a(x) 1{y = x} + (1 − a(x)) r(y)] must equal p(y)."""
    generator = torch.Generator().manual_seed(case)
    p = _random_distribution(generator, zeros=case % 3)  # p may exclude tokens (top-k/top-p)
    q = _random_distribution(generator, zeros=(case // 3) % 2)  # q may exclude tokens too
    if case == 0:
        q = p.clone()  # p == q: the residual is all zeros and must be guarded
    output = torch.zeros(V, dtype=torch.float64)
    residual = residual_distribution(p[None], q[None])[0]
    for x in range(V):
        if q[x] == 0:
            continue  # never drafted
        accept = acceptance_probability(p[x], q[x])
        output[x] += q[x] * accept
        output += q[x] * (1 - accept) * residual
    torch.testing.assert_close(output, p, rtol=0, atol=1e-12)


def test_residual_guard_returns_p_when_p_equals_q():
    p = torch.tensor([[0.25, 0.25, 0.5]])
    assert torch.equal(residual_distribution(p, p.clone()), p)


def test_speculative_accept_samples_p_statistically():
    """Many rows in one batch: the first committed token must follow p_1 (false-alarm rate 1e-3)."""
    generator = torch.Generator().manual_seed(0)
    p_rows = torch.stack([_random_distribution(generator) for _ in range(3)]).float()  # p_1, p_2, p_3
    q_rows = torch.stack([_random_distribution(generator, zeros=1) for _ in range(2)]).float()  # q_1, q_2
    rows = 40_000
    q = q_rows.expand(rows, 2, V)
    p = p_rows.expand(rows, 3, V)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=generator).reshape(rows, 2)
    n, next_token = speculative_accept(draft, q, p, generator)
    first = torch.where(n > 0, draft[:, 0], next_token)
    assert chi_square_p_value(torch.bincount(first, minlength=V), p_rows[0]) > 1e-3
    # Rows that accepted both drafts emit the bonus token from p_3.
    bonus = next_token[n == 2]
    assert chi_square_p_value(torch.bincount(bonus, minlength=V), p_rows[2]) > 1e-3
    # Power check: the same samples are clearly not distributed as q_1.
    assert chi_square_p_value(torch.bincount(first, minlength=V), q_rows[0]) < 1e-6

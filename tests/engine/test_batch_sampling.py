"""Lossless sampling in batches: each row draws from the target's distribution for its prompt alone, and
two rows of one batch are independent draws (docs/design.md rules 2 and 7).

Method of tests/stats_tools.py (exact enumerated reference, chi-square, power check against the
draft): a batch holds PROMPT and a shorter, left-padded second prompt; each row's four new tokens are
counted against that prompt's exact joint, and the joint of the two rows' first tokens against the
product of their exact marginals. The slow tests run in the long_tests lane.
"""

from __future__ import annotations

import pytest
import torch
from stats_tools import ALPHA_EACH, NEW, PROMPT, V, assert_same_distribution, chi_square_p_value, exact_joint
from tiny_models import tiny_model
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper

from assisted_backends import generate

SECOND = torch.tensor([[3, 5]])
SAMPLES = 2500
BATCH = torch.tensor([[1, 4, 2], [0, 3, 5]])  # PROMPT, then SECOND left-padded
MASK = torch.tensor([[1, 1, 1], [0, 1, 1]])


def models():
    target = tiny_model("llama", seed=0, vocab=V, init=0.15)
    draft = tiny_model("llama", seed=1, vocab=V, init=0.15, hidden=32, layers=1)
    return target, draft


def draw_batches(target, draft, samples: int, **options) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Counts [2, V, ..., V] of each row's NEW new tokens over `samples` seeded batches, counts [V, V] of the
    pair (row 0's last new token, row 1's last new token), and the acceptance rate."""
    counts = torch.zeros((2, *[V] * NEW), dtype=torch.float64)
    last_pair = torch.zeros(V, V, dtype=torch.float64)
    accepted = drafted = 0
    for seed in range(samples):
        result = generate(
            target, BATCH, attention_mask=MASK, assistant_model=draft, max_new_tokens=NEW, do_sample=True,
            num_assistant_tokens=3, seed=seed, pad_token_id=0, **options,
        )  # fmt: skip
        for row in range(2):
            counts[(row, *result.sequences[row, BATCH.shape[1] :].tolist())] += 1
        last_pair[int(result.sequences[0, -1]), int(result.sequences[1, -1])] += 1
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    return counts, last_pair, accepted / max(drafted, 1)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ({}, {"static_shapes": True, "bucket_size": 4}), ids=("dynamic", "static_shapes"))
def test_each_row_and_the_pair_of_rows_sample_the_targets_distribution(layout):
    target, draft = models()
    counts, last_pair, acceptance = draw_batches(target, draft, SAMPLES, **layout)
    assert 0.1 < acceptance < 0.9, "the pair must both accept and reject for this test to mean anything"
    warpers = LogitsProcessorList([TemperatureLogitsWarper(1.0)])
    exact = [exact_joint(target, warpers, prompt) for prompt in (PROMPT, SECOND)]
    drafts = [exact_joint(draft, warpers, prompt) for prompt in (PROMPT, SECOND)]
    for row in range(2):
        assert_same_distribution(counts[row], exact[row], other=drafts[row])

    # The rows are independent draws: the pair of their last tokens follows the product of the marginals.
    def last_marginal(joint: torch.Tensor) -> torch.Tensor:
        return joint.sum(dim=tuple(range(NEW - 1)))

    assert chi_square_p_value(last_pair, torch.outer(*map(last_marginal, exact))) > ALPHA_EACH
    assert chi_square_p_value(last_pair, torch.outer(*map(last_marginal, drafts))) < ALPHA_EACH, "power check"


def test_a_seeded_batch_reproduces_and_rows_draw_differently():
    target, draft = models()
    first = generate(target, BATCH, attention_mask=MASK, assistant_model=draft, max_new_tokens=8, do_sample=True,
                     num_assistant_tokens=3, seed=11, pad_token_id=0)  # fmt: skip
    again = generate(target, BATCH, attention_mask=MASK, assistant_model=draft, max_new_tokens=8, do_sample=True,
                     num_assistant_tokens=3, seed=11, pad_token_id=0)  # fmt: skip
    assert torch.equal(first.sequences, again.sequences)
    assert first.sequences.shape == (2, BATCH.shape[1] + 8) and int(first.sequences.max()) < V

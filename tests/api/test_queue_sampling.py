"""Lossless sampling through a queue: a prompt that joins a running batch draws from the target's distribution
for that prompt alone, as do the rows it joins (docs/design.md rules 2 and 7; `engine.joins`).

Method of tests/stats_tools.py and tests/engine/test_batch_sampling.py (exact enumerated reference, chi-square,
power check against the draft): three prompts through two slots, so the third joins when the first row
ends (its first token sampled from its own prompt pass, its rounds verified beside a row in mid-answer);
each prompt's four new tokens are counted against that prompt's exact joint. The slow test runs in the
long_tests lane.
"""

from __future__ import annotations

import pytest
import torch
from stats_tools import NEW, PROMPT, V, assert_same_distribution, exact_joint
from test_batch_sampling import SECOND, models
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper

from assisted_backends import generate_queue

THIRD = torch.tensor([[2, 0, 5, 1]])
QUEUE = [PROMPT[0], SECOND[0], THIRD[0]]
SAMPLES = 2500


def draw_queues(target, draft, samples: int, **options) -> tuple[torch.Tensor, float, int]:
    """Counts [3, V, ..., V] of each prompt's NEW new tokens over `samples` seeded queues, the acceptance rate,
    and how many joined rows' first slot was freed while the other row was still generating."""
    counts = torch.zeros((len(QUEUE), *[V] * NEW), dtype=torch.float64)
    accepted = drafted = mid_run = 0
    for seed in range(samples):
        result = generate_queue(
            target, QUEUE, slots=2, assistant_model=draft, max_new_tokens=NEW, do_sample=True,
            num_assistant_tokens=3, seed=seed, pad_token_id=0, **options,
        )  # fmt: skip
        for row, tokens in enumerate(result.tokens):
            counts[(row, *tokens.tolist())] += 1
        rows = result.stats.rows
        mid_run += rows[2].joined_s < max(rows[0].finished_s, rows[1].finished_s)
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    return counts, accepted / max(drafted, 1), mid_run


@pytest.mark.slow
@pytest.mark.parametrize("layout", ({}, {"static_shapes": True, "bucket_size": 4}), ids=("dynamic", "static_shapes"))
def test_every_prompt_of_a_queue_samples_the_targets_distribution(layout):
    target, draft = models()
    counts, acceptance, mid_run = draw_queues(target, draft, SAMPLES, **layout)
    assert 0.1 < acceptance < 0.9, "the pair must both accept and reject for this test to mean anything"
    assert mid_run > SAMPLES // 4, "the third prompt must often join while the other row is still generating"
    warpers = LogitsProcessorList([TemperatureLogitsWarper(1.0)])
    for row, prompt in enumerate((PROMPT, SECOND, THIRD)):
        assert_same_distribution(
            counts[row], exact_joint(target, warpers, prompt), other=exact_joint(draft, warpers, prompt)
        )


def test_a_seeded_queue_reproduces_and_stays_in_the_vocabulary():
    target, draft = models()

    def run() -> list[list[int]]:
        result = generate_queue(
            target, QUEUE, slots=2, assistant_model=draft, max_new_tokens=8, do_sample=True,
            num_assistant_tokens=3, seed=11, pad_token_id=0,
        )  # fmt: skip
        return [tokens.tolist() for tokens in result.tokens]

    first = run()
    assert first == run()
    assert all(len(tokens) == 8 and max(tokens) < V for tokens in first)

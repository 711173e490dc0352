"""End to end: assisted sampling draws from the same distribution as plain sampling of the target.

The reference is exact, not another sample (see stats_tools: enumerated joint, five chi-square
statistics, false-alarm rate <= 1e-3); the power check runs against the *draft's* distribution.
"""

import pytest
from stats_tools import NEW, PROMPT, V, assert_same_distribution, exact_joint, sample_counts
from tiny_models import tiny_model
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from assisted_backends import generate

SAMPLES = 3000


@pytest.mark.slow
@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, None, None), (0.7, 5, 0.9)],
)
def test_assisted_sampling_matches_plain_sampling(temperature, top_k, top_p):
    target = tiny_model("llama", seed=0, vocab=V, init=0.15)
    draft = tiny_model("llama", seed=1, vocab=V, init=0.15, hidden=32, layers=1)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p:
        warpers.append(TopPLogitsWarper(top_p))

    counts, acceptance = sample_counts(
        lambda seed: generate(
            target,
            PROMPT,
            assistant_model=draft,
            max_new_tokens=NEW,
            do_sample=True,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            num_assistant_tokens=3,
            seed=seed,
        ),
        SAMPLES,
    )
    assert 0.1 < acceptance < 0.9, "the pair must both accept and reject for this test to mean anything"
    assert_same_distribution(counts, exact_joint(target, warpers), other=exact_joint(draft, warpers))

"""End to end: assisted sampling draws from the same distribution as plain sampling of the target.

The reference is exact, not another sample: with a vocabulary of 6 we enumerate every 4-token
continuation, score it with the target (transformers' own warpers), and get the exact probability
of each sequence. Five chi-square statistics (each position's marginal and two adjacent pairs) are
tested at 2e-4 each, so the false-alarm rate of the test is at most 1e-3 (Bonferroni). A power
check runs the same statistics against the *draft's* distribution and must reject.
"""

import itertools

import pytest
import torch
from stats_tools import chi_square_p_value
from tiny_models import tiny_model
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from assisted_backends import generate

V = 6
NEW = 4
SAMPLES = 3000
PROMPT = torch.tensor([[1, 4, 2]])
ALPHA_EACH = 2e-4


def exact_joint(model, warpers: LogitsProcessorList) -> torch.Tensor:
    """P(t_1..t_4 | prompt) under plain sampling: a [V]*4 tensor."""
    continuations = torch.tensor(list(itertools.product(range(V), repeat=NEW - 1)))  # [V^3, 3]
    inputs = torch.cat([PROMPT.expand(len(continuations), -1), continuations], dim=1)
    with torch.inference_mode():
        logits = model(inputs).logits[:, PROMPT.shape[1] - 1 :, :].float()  # [V^3, 4, V]
    rows = logits.reshape(-1, V)
    for warper in warpers:
        rows = warper(None, rows)
    probs = torch.softmax(rows, dim=-1).reshape(len(continuations), NEW, V).double()
    joint = torch.ones(V**NEW, dtype=torch.float64)
    for index, sequence in enumerate(itertools.product(range(V), repeat=NEW)):
        prefix = torch.tensor(sequence[: NEW - 1])
        row = int((prefix * torch.tensor([V * V, V, 1])).sum())
        joint[index] = torch.prod(probs[row, torch.arange(NEW), torch.tensor(sequence)])
    return joint.reshape([V] * NEW)


def statistics(joint_or_counts: torch.Tensor) -> list[torch.Tensor]:
    marginals = [joint_or_counts.sum(dim=[d for d in range(NEW) if d != i]) for i in range(1, NEW)]
    pairs = [joint_or_counts.sum(dim=(0, 3)), joint_or_counts.sum(dim=(0, 1))]
    return marginals + pairs


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

    counts = torch.zeros([V] * NEW, dtype=torch.float64)
    accepted = drafted = 0
    for seed in range(SAMPLES):
        result = generate(
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
        )
        counts[tuple(result.sequences[0, PROMPT.shape[1] :].tolist())] += 1
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0.1 < accepted / drafted < 0.9, "the pair must both accept and reject for this test to mean anything"

    expected = exact_joint(target, warpers)
    for observed, probs in zip(statistics(counts), statistics(expected)):
        assert chi_square_p_value(observed, probs) > ALPHA_EACH

    draft_joint = exact_joint(draft, warpers)
    rejections = [chi_square_p_value(o, p) < ALPHA_EACH for o, p in zip(statistics(counts), statistics(draft_joint))]
    assert any(rejections), "power check: the test must be able to tell the draft's distribution apart"

"""Statistical losslessness tests: an exact enumerated reference and Pearson's chi-square test.

With a vocabulary of V = 6 every NEW = 4-token continuation of PROMPT is enumerated and scored with
the target (transformers' own warpers), giving the exact probability of each sequence under plain
sampling. Five chi-square statistics (each later position's marginal and two adjacent pairs) are
tested at ALPHA_EACH = 2e-4 each, so a test's false-alarm rate is at most 1e-3 (Bonferroni). A power
check runs the same statistics against a different distribution and must reject.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from transformers.generation.logits_process import LogitsProcessorList

V = 6
NEW = 4
PROMPT = torch.tensor([[1, 4, 2]])
ALPHA_EACH = 2e-4


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """P-value of observed counts against expected probabilities (flattened).

    Cells whose expected count is below `min_expected` are pooled into one cell, as the test's
    chi-square approximation requires.
    """
    observed = observed.flatten().double()
    expected = expected_probs.flatten().double() * observed.sum()
    small = expected < min_expected
    if small.any():
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    statistic = ((observed - expected) ** 2 / expected.clamp_min(1e-12)).sum()
    degrees = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2.0, dtype=torch.float64), statistic / 2.0))


def exact_joint(model, warpers: LogitsProcessorList, prompt: torch.Tensor = PROMPT) -> torch.Tensor:
    """P(t_1..t_4 | prompt) under plain sampling: a [V]*4 tensor."""
    continuations = torch.tensor(list(itertools.product(range(V), repeat=NEW - 1)))  # [V^3, 3]
    inputs = torch.cat([prompt.expand(len(continuations), -1), continuations], dim=1)
    with torch.inference_mode():
        logits = model(inputs).logits[:, prompt.shape[1] - 1 :, :].float()  # [V^3, 4, V]
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


def sample_counts(draw: Callable[[int], object], samples: int) -> tuple[torch.Tensor, float]:
    """Counts [V]*NEW of the new tokens of `draw(seed)` for seeds 0..samples-1, and the acceptance rate."""
    counts = torch.zeros([V] * NEW, dtype=torch.float64)
    accepted = drafted = 0
    for seed in range(samples):
        result = draw(seed)
        counts[tuple(result.sequences[0, PROMPT.shape[1] :].tolist())] += 1
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    return counts, accepted / max(drafted, 1)


def assert_same_distribution(counts: torch.Tensor, expected: torch.Tensor, other: torch.Tensor) -> None:
    """Every statistic agrees with `expected`; at least one tells `other` apart (the power check)."""
    for observed, probs in zip(statistics(counts), statistics(expected)):
        assert chi_square_p_value(observed, probs) > ALPHA_EACH
    rejections = [chi_square_p_value(o, p) < ALPHA_EACH for o, p in zip(statistics(counts), statistics(other))]
    assert any(rejections), "power check: the test must be able to tell the other distribution apart"

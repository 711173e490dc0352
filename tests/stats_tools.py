"""Pearson's chi-square goodness-of-fit test, for the statistical losslessness tests."""

from __future__ import annotations

import torch


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

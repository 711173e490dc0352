"""The limit every benchmark is held against (Leviathan et al. 2023), in the notation of docs/design.md.

E(α, γ) = (1 − α^(γ+1)) / (1 − α) tokens per round and S(α, γ, c) = E / (γc + 1) come from the package
(`assisted_backends.engine.schedule`); S_E uses the tokens per round actually measured instead of E(α, γ)
(acceptances are correlated, so it is the tighter bound).
"""

from __future__ import annotations

from assisted_backends.engine.schedule import expected_tokens, leviathan_speedup

__all__ = ["expected_tokens", "leviathan_speedup", "measured_limit"]


def measured_limit(tokens_per_round: float, gamma: int, c: float) -> float:
    """S_E = E / (γc + 1): the speedup if a round cost only γ draft steps and one target step."""
    return tokens_per_round / (gamma * c + 1.0)

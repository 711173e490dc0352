"""Draft-length schedules: how many tokens γ to draft in the next round."""

from __future__ import annotations

from typing import Protocol


class DraftSchedule(Protocol):
    def draft_length(self) -> int:
        """γ for the next round (0 means: no speculation this round)."""

    def update(self, drafted: int, accepted: int) -> None:
        """Learn from the round that just ended."""


class ConstantSchedule:
    """Always γ tokens."""

    def __init__(self, gamma: int) -> None:
        if gamma < 1:
            raise ValueError(f"num_assistant_tokens must be >= 1, got {gamma}")
        self.gamma = gamma

    def draft_length(self) -> int:
        return self.gamma

    def update(self, drafted: int, accepted: int) -> None:
        return None

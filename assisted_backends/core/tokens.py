"""TokenBuffer: the sequence being generated, preallocated once."""

from __future__ import annotations

import torch


class TokenBuffer:
    """Token ids [B, capacity] of which the first `length` are committed.

    Positions past `length` are scratch space: the drafter writes its proposal there, so the
    target's verification input and every processor's prefix are views, never copies.
    """

    def __init__(self, prompt: torch.Tensor, capacity: int, fill_value: int) -> None:
        batch, prompt_length = prompt.shape
        self.ids = torch.full((batch, capacity), fill_value, dtype=torch.long, device=prompt.device)
        self.ids[:, :prompt_length] = prompt
        self.length = prompt_length
        self.prompt_length = prompt_length

    @property
    def capacity(self) -> int:
        return self.ids.shape[1]

    def committed(self) -> torch.Tensor:
        """[B, length] view of the committed tokens."""
        return self.ids[:, : self.length]

    def through(self, end: int) -> torch.Tensor:
        """[B, end] view of committed plus scratch tokens."""
        return self.ids[:, :end]

    def generated(self) -> torch.Tensor:
        """[B, length - prompt_length] the new tokens."""
        return self.ids[:, self.prompt_length : self.length]

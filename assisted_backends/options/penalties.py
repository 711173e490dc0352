"""OpenAI's presence and frequency penalties as a logits processor, and a request's penalties as a list.

OpenAI's penalties act on the tokens generated so far in this answer: with c[t] the count of token t after the
prompt, `scores[t] -= presence · [c[t] > 0] + frequency · c[t]`. `OpenAIPenaltiesLogitsProcessor` computes c from
the ids it is given at each call and keeps no state, so it is a function of the prefix (`options.processors`):
at every verified position of a round it sees the prefix `model.generate` would see there, and plain and
assisted decoding choose the same tokens. `repetition_penalty` is transformers' own processor (it divides a
positive score and multiplies a negative one, for every token of the prompt and the answer).
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import LogitsProcessor, RepetitionPenaltyLogitsProcessor

PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's range for presence and frequency penalties


class OpenAIPenaltiesLogitsProcessor(LogitsProcessor):
    """`scores[b, t] -= presence · [c_b[t] > 0] + frequency · c_b[t]`, c_b the counts of `input_ids[b,
    prompt_length:]` (the answer's tokens: `prompt_length` is the prompt's length as the processor sees it, one
    prompt's own length when it is generated alone or joins a queue)."""

    def __init__(self, presence: float, frequency: float, prompt_length: int) -> None:
        for name, value in (("presence", presence), ("frequency", frequency)):
            if not PENALTY_RANGE[0] <= value <= PENALTY_RANGE[1]:
                raise ValueError(f"{name}: {value} is outside OpenAI's range {list(PENALTY_RANGE)}; give one in it")
        if prompt_length < 0:
            raise ValueError(f"prompt_length: {prompt_length} must be >= 0 (the prompt's token count)")
        self.presence, self.frequency, self.prompt_length = float(presence), float(frequency), prompt_length

    @property
    def counted_from(self) -> int:
        """The first column of the ids it is given that counts (`engine.position_processors.CountPenalty`)."""
        return self.prompt_length

    def from_counts(self, scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """`scores − presence · [c > 0] − frequency · c` for the counts c (the scores' shape and dtype): the formula
        every call applies, also to the gathered scores of the tokens seen when the engine scores all verified
        positions at once."""
        return scores - self.presence * (counts > 0).to(scores.dtype) - self.frequency * counts

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        answer = input_ids[:, self.prompt_length :]
        if answer.shape[1] == 0:
            return scores
        counts = torch.zeros(scores.shape, dtype=scores.dtype, device=scores.device)
        counts.scatter_add_(1, answer.to(scores.device), torch.ones(answer.shape, dtype=scores.dtype,
                                                                     device=scores.device))  # fmt: skip
        return self.from_counts(scores, counts)


def penalty_processors(
    presence: float, frequency: float, repetition: float, prompt_length: int
) -> list[LogitsProcessor]:
    """One request's penalty processors, in llama.cpp's and vLLM's order (repetition, then OpenAI's); none for
    the neutral values (0, 0, 1)."""
    processors: list[LogitsProcessor] = []
    if repetition != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(repetition))
    if presence != 0.0 or frequency != 0.0:
        processors.append(OpenAIPenaltiesLogitsProcessor(presence, frequency, prompt_length))
    return processors

"""One round on its own (`engine/round.py`), with the drafter a test double that writes chosen tokens.

The invariants docs/design.md states for a round: a draft equal to the target's own continuation is accepted
whole and commits γ + 1 tokens; a wrong first draft commits exactly the target's one token; either way the
committed tokens are plain greedy decoding's, and afterwards the target's cache holds every committed column
but the newest (pending). The prefill commits the first token through the same `commit`. A drafter that raises
is dropped with one warning and the round goes on plain (`GuardedDrafter`).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model

from assisted_backends.engine.drafter import Drafter, DraftFailedWarning, GuardedDrafter, Proposal
from assisted_backends.engine.kv_cache import DynamicLayout
from assisted_backends.engine.round import LoopSettings, prefill, speculative_round
from assisted_backends.engine.rows import LiveRows
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import SamplingConfig, TokenSelector
from assisted_backends.engine.stats import GenerationStats
from assisted_backends.engine.tokens import TokenBuffer

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT_LENGTH, NEW_TOKENS = 6, 12


class WritesTokens(Drafter):
    """Proposes the given continuation of the prompt (a wrong one when `wrong`), γ tokens at a time."""

    name = "writes-tokens"

    def __init__(self, continuation: torch.Tensor, wrong: bool = False, fails_in: str | None = None) -> None:
        self.continuation = continuation  # [N]: the tokens after the prompt
        self.wrong, self.fails_in, self.calls = wrong, fails_in, 0

    @property
    def forward_count(self) -> int:
        return self.calls

    def _maybe_fail(self, method: str) -> None:
        if method == self.fails_in:
            raise ValueError(f"simulated failure in {method}")

    def prefill(self, buffer: TokenBuffer) -> None:
        self._maybe_fail("prefill")

    def propose(self, buffer: TokenBuffer, gamma: int, selector, generator) -> Proposal:
        self._maybe_fail("propose")
        self.calls += 1
        done = buffer.length - PROMPT_LENGTH
        tokens = self.continuation[done : done + gamma].clone()
        if self.wrong:
            tokens[0] = (tokens[0] + 1) % 128
        buffer.ids[0, buffer.length : buffer.length + tokens.shape[0]] = tokens
        return Proposal(tokens.shape[0])

    def rollback(self, buffer: TokenBuffer) -> None:
        self._maybe_fail("rollback")


@pytest.fixture(scope="module")
def model_and_plain():
    model = tiny_model("llama", 3)
    prompt = torch.randint(0, 128, (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(5))
    plain = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)[0, PROMPT_LENGTH:]
    return model, prompt, plain


def start(model, prompt):
    """A buffer, the target's runner, the rows and settings after the prefill (first token committed)."""
    buffer = TokenBuffer(prompt, PROMPT_LENGTH + NEW_TOKENS + 8, 0)
    target = ModelRunner(model, DynamicLayout(model, torch.zeros(1, dtype=torch.long)))
    rows = LiveRows(1, 0, GenerationStats(), drop_finished=True)
    selector = TokenSelector(SamplingConfig())
    settings = LoopSettings(NEW_TOKENS, None, False, lambda: None)
    prefill(target, buffer, rows, selector, None, settings)
    return buffer, target, rows, selector, settings


def test_the_prefill_commits_the_first_token(model_and_plain):
    model, prompt, plain = model_and_plain
    buffer, target, rows, _, _ = start(model, prompt)
    assert buffer.length == PROMPT_LENGTH + 1 and buffer.new_tokens == [1]
    assert buffer.ids[0, PROMPT_LENGTH] == plain[0]
    assert target.length == PROMPT_LENGTH  # the first token is pending for the target


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_a_right_draft_is_accepted_whole(model_and_plain, gamma):
    model, prompt, plain = model_and_plain
    buffer, target, rows, selector, settings = start(model, prompt)
    drafter = GuardedDrafter(WritesTokens(plain))
    observation = speculative_round(gamma, target, drafter, buffer, rows, selector, None, settings, None, 0)
    assert (observation.drafted, observation.accepted) == (gamma, gamma)
    assert buffer.length == PROMPT_LENGTH + 1 + gamma + 1
    assert torch.equal(buffer.committed()[0, PROMPT_LENGTH:], plain[: gamma + 2])
    assert target.length == buffer.length - 1


def test_a_wrong_draft_commits_the_targets_one_token(model_and_plain):
    model, prompt, plain = model_and_plain
    buffer, target, rows, selector, settings = start(model, prompt)
    drafter = GuardedDrafter(WritesTokens(plain, wrong=True))
    for _ in range(3):
        observation = speculative_round(3, target, drafter, buffer, rows, selector, None, settings, None, 0)
        assert (observation.drafted, observation.accepted) == (3, 0)
        assert target.length == buffer.length - 1
    assert torch.equal(buffer.committed()[0, PROMPT_LENGTH:], plain[:4])
    assert rows.total.drafted == 9 and rows.total.accepted == 0


def test_rounds_stop_at_max_new_tokens(model_and_plain):
    model, prompt, plain = model_and_plain
    buffer, target, rows, selector, settings = start(model, prompt)
    drafter = GuardedDrafter(WritesTokens(plain))
    while any(rows.live):
        left = NEW_TOKENS - buffer.new_tokens[0]
        speculative_round(min(4, left - 1), target, drafter, buffer, rows, selector, None, settings, None, 0)
    assert torch.equal(buffer.results[0], plain)


@pytest.mark.parametrize("method", ["prefill", "propose", "rollback"])
def test_a_failing_drafter_is_dropped_with_one_warning(model_and_plain, method):
    model, prompt, plain = model_and_plain
    buffer, target, rows, selector, settings = start(model, prompt)
    drafter = GuardedDrafter(WritesTokens(plain, fails_in=method))
    with pytest.warns(DraftFailedWarning, match=f"simulated failure in {method}") as caught:
        for _ in range(3):
            speculative_round(2, target, drafter, buffer, rows, selector, None, settings, None, 0)
    assert len(caught) == 1 and not drafter.active
    assert drafter.propose(buffer, 2, selector, None).count == 0
    assert rows.total.drafting_stopped.startswith("the draft raised ValueError")
    assert torch.equal(buffer.committed()[0, PROMPT_LENGTH:], plain[: buffer.length - PROMPT_LENGTH])

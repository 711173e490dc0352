"""One round on its own (`engine/round.py`), with the drafter a test double that writes chosen tokens.

The invariants docs/design.md states for a round: a draft equal to the target's own continuation is accepted
whole and commits γ + 1 tokens; a wrong first draft commits exactly the target's one token; either way the
committed tokens are plain greedy decoding's, and afterwards the target's cache holds every committed column
but the newest (pending). The prefill commits the first token through the same `verify` and `commit`. A drafter
that raises is dropped with one warning and the round goes on plain (`GuardedDrafter`). A round is
`speculative_round(state, γ)`: the test builds one `DecodingState` and asks for rounds.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model

from assisted_backends.engine.drafter import Drafter, DraftFailedWarning, Proposal
from assisted_backends.engine.kv_cache import DynamicLayout
from assisted_backends.engine.round import prefill, speculative_round
from assisted_backends.engine.runner import ModelRunner, Runner
from assisted_backends.engine.sampling import SamplingConfig, TokenSelector
from assisted_backends.engine.slots import Slots
from assisted_backends.engine.state import DecodingState, LoopSettings
from assisted_backends.engine.stats import GenerationStats

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

    def prefill(self, slots: Slots) -> None:
        self._maybe_fail("prefill")

    def propose(self, slots: Slots, gamma: int, selector, generator) -> Proposal:
        self._maybe_fail("propose")
        self.calls += 1
        done = slots.length - PROMPT_LENGTH
        tokens = self.continuation[done : done + gamma].clone()
        if self.wrong:
            tokens[0] = (tokens[0] + 1) % 128
        slots.write_draft(slots.length, tokens, slot=0)
        return Proposal(tokens.shape[0])

    def rollback(self, slots: Slots) -> None:
        self._maybe_fail("rollback")

    def move_rows(self, move, slots: Slots) -> None:
        return None  # one row: never moves

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        return None  # no queue here


@pytest.fixture(scope="module")
def model_and_plain():
    model = tiny_model("llama", 3)
    prompt = torch.randint(0, 128, (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(5))
    plain = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)[0, PROMPT_LENGTH:]
    return model, prompt, plain


def start(model, prompt, drafter: Drafter | None = None) -> DecodingState:
    """The decoding state after the prefill (first token committed): the slots, the target's runner reading the
    slots' padding, `drafter` behind its guard, the settings."""
    slots = Slots(prompt, PROMPT_LENGTH + NEW_TOKENS + 8, 0)
    target = ModelRunner(model, DynamicLayout(model, slots.padding))
    settings = LoopSettings(NEW_TOKENS, None, False, lambda: None)
    state = DecodingState.build(target, drafter, slots, TokenSelector(SamplingConfig()), None, settings,
                                GenerationStats())  # fmt: skip
    prefill(state)
    return state


def test_the_runner_satisfies_the_protocol_the_engine_types_against(model_and_plain):
    model, prompt, _ = model_and_plain
    assert isinstance(start(model, prompt).target, Runner)


def test_the_prefill_commits_the_first_token(model_and_plain):
    model, prompt, plain = model_and_plain
    state = start(model, prompt)
    slots = state.slots
    assert slots.length == PROMPT_LENGTH + 1 and slots.new_tokens == [1]
    assert slots.ids[0, PROMPT_LENGTH] == plain[0]
    assert state.target.length == PROMPT_LENGTH  # the first token is pending for the target
    assert state.stats.rounds == 0  # the prompt pass is no round of the statistics


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_a_right_draft_is_accepted_whole(model_and_plain, gamma):
    model, prompt, plain = model_and_plain
    state = start(model, prompt, WritesTokens(plain))
    observation = speculative_round(state, gamma)
    assert (observation.drafted, observation.accepted) == (gamma, gamma)
    assert state.slots.length == PROMPT_LENGTH + 1 + gamma + 1
    assert torch.equal(state.slots.committed()[0, PROMPT_LENGTH:], plain[: gamma + 2])
    assert state.target.length == state.slots.length - 1


def test_a_wrong_draft_commits_the_targets_one_token(model_and_plain):
    model, prompt, plain = model_and_plain
    state = start(model, prompt, WritesTokens(plain, wrong=True))
    for _ in range(3):
        observation = speculative_round(state, 3)
        assert (observation.drafted, observation.accepted) == (3, 0)
        assert state.target.length == state.slots.length - 1
    assert torch.equal(state.slots.committed()[0, PROMPT_LENGTH:], plain[:4])
    assert state.stats.drafted == 9 and state.stats.accepted == 0 and state.stats.rounds == 3
    assert state.slots.rows[0].drafted == 9  # the row's own statistics, kept in the same place


def test_rounds_stop_at_max_new_tokens(model_and_plain):
    model, prompt, plain = model_and_plain
    state = start(model, prompt, WritesTokens(plain))
    while any(state.slots.generating):
        speculative_round(state, min(4, state.slots.tokens_left() - 1))
    assert torch.equal(state.slots.results[0], plain)


@pytest.mark.parametrize("method", ["prefill", "propose", "rollback"])
def test_a_failing_drafter_is_dropped_with_one_warning(model_and_plain, method):
    model, prompt, plain = model_and_plain
    state = start(model, prompt, WritesTokens(plain, fails_in=method))
    drafter, slots = state.drafter, state.slots
    with pytest.warns(DraftFailedWarning, match=f"simulated failure in {method}") as caught:
        for _ in range(3):
            speculative_round(state, 2)
    assert len(caught) == 1 and not drafter.active
    assert drafter.propose(2, state.selector, None).count == 0
    assert state.stats.drafting_stopped.startswith("the draft raised ValueError")
    assert torch.equal(slots.committed()[0, PROMPT_LENGTH:], plain[: slots.length - PROMPT_LENGTH])

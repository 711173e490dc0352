"""The grammar as a prefix-dependent logits processor: exact under speculation because it is a function of the
prefix it is given.

At verify position j the package's `TokenSelector` calls processors with the prefix extended by the round's first
j draft tokens, and in the next round with a prefix that may have lost a rejected tail; `model.generate` calls
them once per token. `GrammarProcessor` keeps, per row of the calls it sees, the prompt of that row's first call
and the generated tokens its matcher has consumed; each call brings the matcher to the call's own generated
tokens (rolling back to the longest common prefix, then consuming the rest) and masks every token the grammar
forbids after them. So the mask never depends on which calls came before, only on the prefix.

Tokens the grammar forbids can sit inside a verified prefix (a draft proposed them): the matcher stops at the
first one and the positions after it are left unmasked (their tokens are rejected anyway: the forbidden draft
token has probability 0 under the masked p). The engine asks first (`allowed_count`) and verifies no draft past
the first forbidden one (`TokenSelector.allowed_drafts`). EOS ids are allowed only where the grammar is complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers.generation.logits_process import LogitsProcessor

from assisted_backends.structured.grammars import Grammar


class _Lane:
    """One sequence: its prompt, its matcher and the generated tokens the matcher has consumed."""

    def __init__(self, grammar: Grammar, prompt: list[int]) -> None:
        self.matcher: Any = grammar.matcher()
        if self.matcher.is_error():
            raise ValueError(f"the grammar cannot be used: {self.matcher.get_error()}")
        self.prompt = prompt
        self.consumed: list[int] = []

    def continues(self, ids: list[int]) -> bool:
        """Whether `ids` is this sequence's prompt followed by generated tokens."""
        return len(ids) >= len(self.prompt) and ids[: len(self.prompt)] == self.prompt

    def follow(self, generated: list[int]) -> bool:
        """Bring the matcher to the state after `generated`; False when a token of it leaves the grammar."""
        common, limit = 0, min(len(self.consumed), len(generated))
        while common < limit and self.consumed[common] == generated[common]:
            common += 1
        if common < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - common)
            del self.consumed[common:]
        rest = generated[common:]
        if not rest:
            return True
        taken = self.matcher.try_consume_tokens(rest)
        self.consumed.extend(rest[:taken])
        return taken == len(rest)

    def allowed(self, vocab: int) -> torch.Tensor:
        """[vocab] bool: the tokens the grammar allows next (none beyond the tokenizer's lexicon)."""
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = torch.from_numpy(bits).view(torch.bool)
        if allowed.shape[0] < vocab:
            allowed = torch.cat([allowed, allowed.new_zeros(vocab - allowed.shape[0])])
        return allowed[:vocab]


class GrammarProcessor(LogitsProcessor):
    """Masks (to -inf) every token `grammar` forbids after the generated tokens of each row's prefix.

    Pass it as `logits_processor=[...]` to `assisted_backends.generate` (or transformers' `model.generate`). The
    package gives every call, batch row and queued prompt its own copy (`for_new_sequence`); with transformers, use
    one processor per `generate` call. Build it with `assisted_backends.structured.json_schema` and its siblings.
    """

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self._lanes: dict[int, _Lane] = {}

    def for_new_sequence(self) -> GrammarProcessor:
        """The same grammar, no sequence started."""
        return GrammarProcessor(self.grammar)

    def grammar_for(self, prompt: list[int]) -> Grammar:
        """The grammar of the answer to `prompt`."""
        return self.grammar

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        vocab = scores.shape[-1]
        allowed = torch.ones(scores.shape, dtype=torch.bool)
        for row, ids in enumerate(input_ids.tolist()):
            lane = self._lane(row, ids)
            if lane.follow(ids[len(lane.prompt) :]):
                allowed[row] = lane.allowed(vocab)
        return torch.where(allowed.to(scores.device), scores, float("-inf"))

    def allowed_count(self, prefix: list[int], drafts: list[int]) -> int:
        """How many of `drafts` the grammar allows in a row after `prefix` (one sequence's ids, as a call would
        give them): the engine verifies no draft past the first forbidden one (`TokenSelector.allowed_drafts`)."""
        lane = self._lane(0, prefix)
        generated = prefix[len(lane.prompt) :]
        if not lane.follow(generated):
            return 0
        lane.follow(generated + drafts)
        return len(lane.consumed) - len(generated)

    def _lane(self, row: int, ids: list[int]) -> _Lane:
        """Row `row`'s sequence, started anew when `ids` is not its prompt followed by generated tokens."""
        lane = self._lanes.get(row)
        if lane is None or not lane.continues(ids):
            lane = self._lanes[row] = _Lane(self.grammar_for(ids), ids)
        return lane


class PromptGrammars(GrammarProcessor):
    """A grammar per prompt, for a batch or queue whose answers follow different grammars: each row's answer
    follows the grammar whose prompt its own prompt ends with (the longest such; padding may precede it)."""

    def __init__(self, grammars: Sequence[tuple[Sequence[int], Grammar]]) -> None:
        table = {tuple(int(t) for t in prompt): grammar for prompt, grammar in grammars}
        if len(table) < len(grammars) or not table or not all(table):
            raise ValueError("grammars: give each prompt (non-empty token ids) once, with its answer's grammar")
        super().__init__(next(iter(table.values())))
        self.table = table

    def for_new_sequence(self) -> PromptGrammars:
        return PromptGrammars(list(self.table.items()))

    def grammar_for(self, prompt: list[int]) -> Grammar:
        ends = [key for key in self.table if tuple(prompt[-len(key) :]) == key]
        if not ends:
            raise ValueError(
                f"grammars: no grammar was given for the prompt ending {prompt[-8:]}; give every prompt of the batch"
            )
        return self.table[max(ends, key=len)]

"""The batch's slots have one owner (`engine.slots.Slots`), drafters follow them through a protocol whose `move_rows`
and `insert_row` are required, and a round's `Verification` is built by name.

Each test fails where the rule breaks: a drafter class that forgets `insert_row` or `move_rows` cannot be built; a
draft written over committed tokens is refused; a move carries every per-slot list at once (a slot kept twice, the
batch growing, is an empty copy that does not generate); a commit keeps a finishing row's tokens, its statistics and
calls the finish hook once; `Verification` refuses positional integers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import assisted_backends
from assisted_backends.engine.acceptance import Verification
from assisted_backends.engine.drafter import Drafter, Proposal
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.slots import Slots
from assisted_backends.engine.stats import GenerationStats


class ForgetsInsertRow(Drafter):
    """A stateful drafter that follows moves but forgot a queue's joining rows."""

    name = "forgets-insert-row"
    forward_count = 0

    def prefill(self, slots: Slots) -> None:
        return None

    def propose(self, slots: Slots, gamma: int, selector, generator) -> Proposal:
        return Proposal(0)

    def rollback(self, slots: Slots) -> None:
        return None

    def move_rows(self, move: RowMove, slots: Slots) -> None:
        return None


class ForgetsMoveRows(ForgetsInsertRow):
    """The other way round: joining rows taken in, moves forgotten (its parent's `move_rows` taken away)."""

    move_rows = Drafter.move_rows

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        return None


@pytest.mark.parametrize("drafter", [ForgetsInsertRow, ForgetsMoveRows])
def test_a_drafter_that_forgets_to_follow_the_slots_cannot_be_built(drafter):
    missing = "insert_row" if drafter is ForgetsInsertRow else "move_rows"
    with pytest.raises(TypeError, match=missing):
        drafter()


def three_slots() -> Slots:
    """Three slots of 4 prompt columns (slot 1 with 2 of padding), capacity 12, opened with a limit of 5."""
    prompt = torch.tensor([[1, 2, 3, 4], [0, 0, 5, 6], [7, 8, 9, 10]])
    slots = Slots(prompt, 12, 0, pad=[0, 2, 0])
    slots.open(GenerationStats(), 5, {2: 3}, None)
    return slots


def test_a_draft_goes_to_scratch_columns_only():
    slots = three_slots()
    slots.write_draft(4, torch.tensor([[11, 12], [13, 14], [15, 16]]))
    slots.write_draft(6, torch.tensor([17, 18]), slot=1)
    assert slots.ids[:, 4:6].tolist() == [[11, 12], [13, 14], [15, 16]] and slots.ids[1, 6:8].tolist() == [17, 18]
    with pytest.raises(RuntimeError, match="overwrite committed tokens"):
        slots.write_draft(3, torch.tensor([1, 2, 3]))
    assert slots.ids[:, 3].tolist() == [4, 6, 10]


def test_limits_are_the_calls_or_a_rows_own():
    slots = three_slots()
    assert slots.limits == [5, 5, 3] and slots.tokens_left() == 5


def test_a_move_carries_every_list_and_a_copied_slot_does_not_generate():
    slots = three_slots()
    slots.commit({0: 1, 1: 2, 2: 1}, {0: False, 1: False, 2: True}, 4)
    kept = (1, 0, 1)  # slot 1 twice: the batch grows by a copy of it; slot 2 (finished) leaves
    move = RowMove(torch.tensor(kept), torch.zeros(3, dtype=torch.long), (0, 0, 0), kept)
    slots.move(move, [2, 0, 2], 6)
    assert slots.caller_rows == [1, 0, 1] and slots.new_tokens == [2, 1, 2] and slots.limits == [5, 5, 5]
    assert slots.generating == [True, True, False] and slots.padding.host == [2, 0, 2] and slots.length == 6
    assert slots.ids[:, :4].tolist() == [[0, 0, 5, 6], [1, 2, 3, 4], [0, 0, 5, 6]]


def test_a_finishing_commit_keeps_the_result_the_statistics_and_calls_the_hook_once():
    prompt = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    slots, finished, stats = Slots(prompt, 12, 0), [], GenerationStats()
    slots.open(stats, 5, {}, lambda row, tokens: finished.append((row, tokens.tolist())))
    slots.write_draft(4, torch.tensor([[21, 22], [23, 24]]))
    slots.commit({0: 2, 1: 1}, {0: True, 1: False}, 4)
    assert finished == [(0, [21, 22])] and slots.results[0].tolist() == [21, 22] and slots.live() == [1]
    assert stats.rows is slots.rows and [row.new_tokens for row in stats.rows] == [2, 1]
    assert stats.rows[0].finished_s > 0 and stats.rows[1].finished_s == 0
    slots.end_round(5)  # the round's shared length: slot 1's token at column 4
    slots.finish(1)  # a caller that left: its row ends with what it committed
    assert finished[-1] == (1, [23]) and slots.live() == []


def test_a_verification_is_built_by_name():
    accepted, token, logits = torch.tensor([1]), torch.tensor([5]), torch.zeros(1, 3, 8)
    with pytest.raises(TypeError):
        Verification(accepted, token, logits, None, 2, 2, 2, 3)  # the positional form is refused
    chain = Verification.chain(accepted, token, logits, None, 2)
    assert (chain.drafts, chain.verified, chain.scheduled, chain.fed, chain.tree) == (2, 2, 2, 3, False)
    tree = Verification.tree_path(accepted, token, logits[:, :2], logits[:, :2], 1, 6, 2)
    assert (tree.drafts, tree.verified, tree.scheduled, tree.fed, tree.tree) == (1, 6, 2, 7, True)


PACKAGE = Path(assisted_backends.__file__).parent


def _package_lines(pattern: str, outside: set[str]) -> list[str]:
    """`path:line: text` of every package line matching `pattern`, files in `outside` (relative paths) left out."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in outside:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_only_the_slots_write_their_ids_and_lists():
    ids = r"\.ids\[[^\]]*\]\s*=[^=]|\.ids\[[^\]]*\]\.(copy_|scatter_|fill_)\("
    assert _package_lines(ids, {"engine/slots.py"}) == []
    slot_lists = r"(generating|caller_rows|new_tokens|limits|results)"
    writes = rf"(?<!self)\.{slot_lists}\s*(\[[^\]]*\])?\s*(=[^=]|\+=)|\.{slot_lists}\.(append|extend|pop)\("
    assert _package_lines(writes, {"engine/slots.py"}) == []


def test_the_call_statistics_are_written_by_their_own_methods_only():
    fields = "|".join(GenerationStats.__dataclass_fields__)
    assert _package_lines(rf"\bstats\.({fields})\s*(=[^=]|\+=|-=)", set()) == []
    assert _package_lines(r"\bstats\.rows\.(append|extend)", set()) == []

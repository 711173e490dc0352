"""Row realignment on its own (`engine/realign.py`): the invariants docs/design.md states under "Batches".

After a round in which row b accepted n_b draft tokens (and committed n_b + 1), row b moves right by N − n_b
(N the largest n_b among rows still generating), then every row moves left by the padding all rows share:
- every row still generating ends at one shared column again, and no column of padding is shared by all;
- a moved row keeps its position ids (column minus padding), so its cached keys keep their rotary positions;
- tokens and cache tensors move by the same per-row shift; nothing moves when no row needs to.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from assisted_backends.engine.realign import RowMove, plan_move, widen

CPU = torch.device("cpu")


def committed_rows(pad: list[int], length: int) -> torch.Tensor:
    """[B, length]: 0 on each row's left padding, then the row's tokens 1, 2, 3, ... (a token's value is its
    position + 1)."""
    columns = torch.arange(length)[None, :] - torch.tensor(pad)[:, None]
    return torch.where(columns >= 0, columns + 1, torch.zeros_like(columns))


CASES = [
    # (left padding per row before the round, drafts accepted per row, rows still generating)
    ([0, 0], [3, 1], [True, True]),
    ([2, 0, 1], [0, 4, 2], [True, True, True]),
    ([0, 3], [4, 4], [True, True]),
    ([1, 0, 0], [2, 0, 1], [True, False, True]),
    ([0, 5], [0, 3], [True, True]),
]


@pytest.mark.parametrize(("pad", "accepted", "active"), CASES)
def test_rows_still_generating_end_at_one_column_without_shared_padding(pad, accepted, active):
    length = 8
    move, new_pad, cut = plan_move(pad, accepted, active, [True] * len(pad), CPU)
    ends = [length + accepted[b] + 1 for b in range(len(pad))]  # each row's end after committing n_b + 1
    shifts = move.shifts if move is not None else (0,) * len(pad)
    moved_ends = {ends[b] + shifts[b] for b in range(len(pad)) if active[b]}
    assert len(moved_ends) == 1  # one shared column
    most = max(accepted[b] for b in range(len(pad)) if active[b])
    assert moved_ends.pop() == length + most + 1 - cut  # the longest row's end, less the padding all rows shared
    assert min(new_pad[b] for b in range(len(pad)) if active[b]) == 0  # the shared padding is gone
    assert all(p >= 0 for p in new_pad) and cut >= 0


@pytest.mark.parametrize(("pad", "accepted", "active"), CASES)
def test_a_moved_row_keeps_its_position_ids(pad, accepted, active):
    length = 8 + max(accepted) + 1
    ends = [8 + n + 1 for n in accepted]
    tokens = committed_rows(pad, length) * (torch.arange(length)[None, :] < torch.tensor(ends)[:, None])
    move, new_pad, _ = plan_move(pad, accepted, active, [True] * len(pad), CPU)
    if move is None:
        pytest.skip("nothing moves in this case")
    moved = move.apply(tokens)
    for b in range(len(pad)):
        if not active[b]:
            continue
        row = moved[b]
        columns = torch.arange(row.shape[0])
        real = (columns >= new_pad[b]) & (columns < ends[b] + move.shifts[b])  # the row's tokens, not filler
        assert torch.equal(row[real], columns[real] - new_pad[b] + 1)  # token value − 1 == its position id


def test_tokens_and_cache_tensors_move_by_the_same_shift():
    pad, accepted = [1, 0, 2], [0, 3, 1]
    move, _, _ = plan_move(pad, accepted, [True] * 3, [True] * 3, CPU)
    ids = torch.arange(3 * 10).reshape(3, 10)
    cache = ids[:, None, :, None].expand(3, 2, 10, 4).float().contiguous()  # [B, H, T, D], a cache's shape
    moved_ids = move.apply(ids)
    moved_cache = move.apply(cache, seq_dim=-2)  # the index_select path
    assert torch.equal(moved_cache[:, 0, :, 0].long(), moved_ids)
    assert torch.equal(moved_cache, moved_ids[:, None, :, None].expand(3, 2, 10, 4).float())


def test_finished_rows_that_do_not_stay_leave_the_batch():
    move, new_pad, _ = plan_move([0, 1, 0], [2, 1, 0], [True, False, True], [True, False, True], CPU)
    assert move is not None and move.kept == (0, 2) and torch.equal(move.keep, torch.tensor([0, 2]))
    assert len(new_pad) == 2
    assert move.apply(torch.arange(12).reshape(3, 4)).shape[0] == 2


def test_nothing_moves_when_every_row_accepted_the_same():
    move, new_pad, cut = plan_move([0, 2], [3, 3], [True, True], [True, True], CPU)
    assert move is None and new_pad == [0, 2] and cut == 0


def test_width_cuts_or_keeps_columns():
    move = RowMove(None, torch.tensor([1, -1]), (1, -1), (0, 1))
    moved = move.apply(torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), width=3)
    assert moved.shape == (2, 3)
    assert moved[0, 1:].tolist() == [1, 2] and moved[1].tolist() == [6, 7, 8]


def test_widen_moves_every_row_right_and_pads_it():
    move, pads = widen([0, 2], 3, CPU)
    assert pads == [3, 5] and move.shifts == (3, 3)
    moved = move.apply(torch.tensor([[1, 2, 3, 4], [0, 0, 5, 6]]), width=7)
    assert moved[:, 3:].tolist() == [[1, 2, 3, 4], [0, 0, 5, 6]]


def test_every_small_round_keeps_the_invariants():
    """Exhaustively over two and three rows with small paddings and acceptances."""
    for rows in (2, 3):
        for pad in itertools.product(range(3), repeat=rows):
            for accepted in itertools.product(range(3), repeat=rows):
                move, new_pad, _ = plan_move(list(pad), list(accepted), [True] * rows, [True] * rows, CPU)
                shifts = move.shifts if move is not None else (0,) * rows
                assert len({accepted[b] + shifts[b] for b in range(rows)}) == 1
                assert min(new_pad) == 0 or move is None and min(pad) > 0 and len(set(accepted)) == 1
                assert [new_pad[b] - pad[b] for b in range(rows)] == list(shifts)

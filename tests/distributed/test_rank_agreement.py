"""Rank agreement in one process: nothing is sent, the timeout setting parses, the wrapper schedule
passes rank 0's decisions through. The 2-rank behaviour is tested in test_deepspeed_rank_agreement.py."""

from __future__ import annotations

import pytest
import torch

from assisted_backends.distributed import agreement as rank_agreement
from assisted_backends.distributed import launch as distributed
from assisted_backends.engine.schedule import AdaptiveSchedule, ConstantSchedule, RoundObservation


def test_the_timeout_comes_from_the_environment_and_bad_values_name_the_variable():
    name = rank_agreement.TIMEOUT_ENV
    assert rank_agreement.collective_timeout_s({}) == rank_agreement.DEFAULT_TIMEOUT_S == 300
    assert rank_agreement.collective_timeout_s({name: "7.5"}) == 7.5
    for bad in ("0", "-3", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match=f"{name}='{bad}' must be a positive number of seconds"):
            rank_agreement.collective_timeout_s({name: bad})


def test_fingerprints_separate_sequences_that_differ_anywhere():
    base = [5, 17, 99, 3]
    assert rank_agreement.fingerprint(base) == rank_agreement.fingerprint(list(base))
    variants = [[5, 17, 99], [5, 17, 99, 4], [17, 5, 99, 3], [5, 17, 99, 3, 0], [0, 5, 17, 99, 3]]
    prints = {rank_agreement.fingerprint(v) for v in variants} | {rank_agreement.fingerprint(base)}
    assert len(prints) == len(variants) + 1
    assert all(0 <= p < 2**61 for p in prints)


def test_one_process_gets_no_agreement_and_the_helpers_do_nothing(tmp_path):
    assert rank_agreement.RankAgreement.current() is None  # no process group
    assert rank_agreement.rank0_decides(None, 1, 7) == 7
    with rank_agreement.watched(None, buffer=None, stats=None):
        pass
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert rank_agreement.RankAgreement.current() is None  # a world of one: still nothing to send
        assert distributed.per_rank_path("out.{rank}.json") == "out.0.json"
        assert distributed.per_rank_path("out.json") == "out.json"
    finally:
        torch.distributed.destroy_process_group()
    assert distributed.per_rank_path(None) is None


def test_the_agreed_schedule_takes_rank_0s_gamma_and_keeps_constant_schedules_unwrapped(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        group = rank_agreement._agreement_group(rank_agreement.timedelta(seconds=30))
        ranks = rank_agreement.RankAgreement(rank=0, world_size=1, timeout_s=30, group=group)
        constant = ConstantSchedule(3)
        assert ranks.schedule(constant) is constant  # a constant γ needs no collective per round
        inner = AdaptiveSchedule(max_gamma=4)
        agreed = ranks.schedule(inner)
        assert isinstance(agreed, rank_agreement.AgreedSchedule) and agreed.max_gamma == 4
        gammas = []
        for accepted in (0, 0, 2, 3, 1):
            gammas.append(agreed.draft_length())
            agreed.update(RoundObservation(gammas[-1], min(accepted, gammas[-1]), 0.001 * gammas[-1], 0.01))
        assert gammas == inner.chosen  # on rank 0 the wrapper is transparent
        assert ranks.start(None, True, torch.tensor([[1, 2, 3]]), [8, 16]) >= 0  # sampling: a seed is chosen
        assert ranks.start(None, False, torch.tensor([[1, 2, 3]]), [8, 16]) is None  # greedy: nothing to seed
        assert ranks.start(5, True, torch.tensor([[1, 2, 3]]), [8, 16]) == 5
        assert rank_agreement.rank0_decides(ranks, 1, 1) == 1
    finally:
        torch.distributed.destroy_process_group()

"""Helpers drafters share; the `Drafter` protocol they implement is the engine's (`engine.drafter`)."""

from __future__ import annotations

import torch

from assisted_backends.engine.drafter import Proposal
from assisted_backends.engine.slots import Slots


def fill_proposal(
    slots: Slots,
    written: list[int],
    count: int,
    vocab_size: int,
    do_sample: bool,
    row_q: list[torch.Tensor | None] | None = None,
) -> Proposal:
    """A proposal of `count` tokens at slots.ids[:, length : length + count] where row b wrote its first
    written[b]: the rest of each row repeats the token before them. When sampling, q is row b's own
    distributions (`row_q[b]` [1, written[b], V]) for what it wrote and a point mass on every filler token.
    What drafters propose where they have nothing (static shapes need exactly γ, a batch one γ for all
    rows); correctness never depends on it."""
    at = slots.length
    for b, done in enumerate(written):
        if done < count:  # the token before the filler, repeated
            slots.write_draft(at + done, slots.ids[b, at + done - 1].expand(count - done), slot=b)
    if not do_sample or count == 0:
        return Proposal(count, None)
    q = torch.nn.functional.one_hot(slots.ids[:, at : at + count], vocab_size).float()  # [B, count, V]
    for b, own in enumerate(row_q or []):
        if own is not None and written[b]:
            q[b, : written[b]] = own[0, : written[b]].to(q.dtype)
    return Proposal(count, q)

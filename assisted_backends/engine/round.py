"""One round of assisted decoding: draft γ → verify γ + 1 → accept n → commit n + 1 → roll back the rest.

Notation (Leviathan et al. 2023, Chen et al. 2023; glossary in docs/design.md). A round starts with L committed
tokens in the slots, the newest (column L − 1) pending: the target's cache holds columns [0, L − 1). The
drafter writes x_1..x_γ at columns [L, L + γ); the target scores the pending token and the drafts in one pass
(m = γ + 1 positions); each row b accepts n_b ≤ γ drafts (greedy: the longest prefix equal to the target's
argmax; sampling: the rejection rule of `engine.acceptance`) and gets the target's own token y_b after them.
Each row commits min(n_b + 1, what it has left, through its first EOS or stop); the target's cache and the
drafter's roll back to the committed tokens, the newest pending again. The prompt pass is the round with
nothing drafted: every committed token pending, through the same `verify` and `commit` (n = 0).

Everything a round reads and changes is one `DecodingState` (`engine.state`): a round is
`speculative_round(state, γ)`; `verify` returns one `Verification` whichever way it verified; the slots commit
(`engine.slots`); the state keeps the round's statistics in one place (`DecodingState.record_round`) and realigns
the rows of a batch (`settle`).
"""

from __future__ import annotations

import time

import torch

from assisted_backends.engine.acceptance import Verification, greedy_accept, speculative_accept, tree_accept
from assisted_backends.engine.drafter import Proposal
from assisted_backends.engine.head_on_demand import greedy_accept_on_demand
from assisted_backends.engine.runner import Runner
from assisted_backends.engine.sampling import TokenSelector, greedy_tokens, sample
from assisted_backends.engine.schedule import RoundObservation
from assisted_backends.engine.slots import Slots
from assisted_backends.engine.state import DecodingState


def speculative_round(state: DecodingState, gamma: int) -> RoundObservation:
    """One round asking for γ draft tokens (γ = 0: a plain round); what it cost and yielded, for the schedule."""
    slots, drafter = state.slots, state.drafter
    start, live = slots.length, slots.live()  # L; the slots generating
    callers = [slots.caller_rows[b] for b in live]  # before the rows move
    if gamma > 0 and not drafter.ready():  # the drafter's first look at the committed tokens
        gamma = 0
    began = time.perf_counter()
    proposal = drafter.propose(gamma, state.selector, state.generator)  # x_1..x_γ' at columns [L, L + γ')
    if state.settings.static_shapes:
        if drafter.active and proposal.count != gamma:
            raise RuntimeError(f"{drafter.name} proposed {proposal.count} tokens; static shapes need exactly {gamma}")
    else:  # drafts a row's grammar forbids are not verified
        proposal = proposal.cut(state.selector.allowed_drafts(slots, start, proposal.count))
    drafter.note_stop(state.stats)
    drafted_at = time.perf_counter()
    verification = verify(state, start, proposal)
    n, kept = commit(state, start, verification)
    verified_at = time.perf_counter()
    left = state.settle(start, n, kept, drafted=gamma > 0)  # batches: realign the rows; both caches rolled back
    drafter.note_stop(state.stats)
    # batches: the verify cost includes realigning the rows (it grows with γ too), but not dropping rows that ended
    # (a copy of the batch's cache, 4-5 plain passes at 4 rows, whatever γ: it priced plain decoding up in a server)
    verify_s = (time.perf_counter() if slots.batched and not left else verified_at) - drafted_at
    accepted = [n[b] for b in live]
    return state.record_round(verification, callers, accepted, (drafted_at - began, verify_s), gamma > 0, len(n))


def prefill(state: DecodingState) -> None:
    """The prompt pass: the round with nothing drafted. The target reads every committed token (all pending: its
    cache is empty) and each row's first token is chosen and committed through the same `verify` and `commit` as
    a round's. The drafter sees nothing yet (`GuardedDrafter.ready`); rows realign in the loop, where they may."""
    start = state.slots.length
    commit(state, start, verify(state, start, Proposal(0)))
    state.slots.end_round(start + 1)


def verify(state: DecodingState, start: int, proposal: Proposal) -> Verification:
    """One target pass over the pending tokens and the proposal's drafts; what it decided (`Verification`).

    A token tree where the round may take one (`_tree_wanted`: `verify_tree`), else the chain of the γ' drafts at
    columns [start, start + γ'): m = γ' + 1 positions, except when the head runs on demand (greedy, the state's
    split wanting it): then the logits of position 1 come first and the rest only if some row accepted x_1
    (`engine.head_on_demand`), and no scores are kept. The prompt pass (nothing drafted, nothing cached yet) reads
    the last position's logits only, as `model.generate`'s prefill does.
    """
    if _tree_wanted(state, start, proposal):  # one row, dynamic cache: the path, then a chain
        return verify_tree(state.target, state.slots, start, proposal, state.selector, state.generator)
    target, slots, selector, split = state.target, state.slots, state.selector, state.split
    gamma = proposal.count
    draft = slots.ids[:, start : start + gamma]  # [B, γ]
    tokens = slots.ids[:, target.length : start + gamma]  # [B, pending + γ]
    starts = slots.row_starts()
    if split is not None and gamma > 0 and split.wanted():
        hidden = target.forward(tokens, hidden_only=True)  # [B, γ+1, D]
        choose = selector.greedy_from(slots.ids, start, starts)
        accepted, next_token, logits = greedy_accept_on_demand(draft, hidden, split.head, choose, split)
        return Verification.chain(accepted, next_token, logits, None, gamma)
    prompt_pass = gamma == 0 and target.length == 0  # nothing cached yet: every committed token pending
    logits = target.forward(tokens, last_only=prompt_pass)  # [B, γ+1, V] ([B, 1, V] for the prompt pass)
    scores = selector.scores(logits, slots.through(start + gamma), starts)  # [B, γ+1, V]
    if not selector.do_sample:
        accepted, next_token = greedy_accept(draft, greedy_tokens(scores))
        if split is not None and gamma > 0:
            split.record_outcome(bool((accepted > 0).any()))
    elif gamma > 0:
        accepted, next_token = speculative_accept(draft, proposal.q, torch.softmax(scores, dim=-1), state.generator)
    else:
        p = torch.softmax(scores, dim=-1)  # [B, 1, V]
        accepted = torch.zeros(p.shape[0], dtype=torch.long, device=p.device)
        next_token = sample(p[:, -1], state.generator)
    return Verification.chain(accepted, next_token, logits, scores, gamma)


def _tree_wanted(state: DecodingState, start: int, proposal: Proposal) -> bool:
    """Whether this round verifies the proposal's token tree rather than its chain: a tree with branches, one row,
    no fixed shapes or queue, a runner that can (`Runner.tree_refusal`); else the chain, as always."""
    tree, target, settings = proposal.tree, state.target, state.settings
    if tree is None or tree.size <= proposal.count or state.slots.batched or settings.static_shapes:
        return False
    if settings.refill is not None or target.length != start - 1:
        return False  # queues
    if target.tree_refusal() is not None:
        return False
    if proposal.tree_expected is None:
        return True
    return state.tree_price.worth(proposal.count + 1, tree.size + 1, *proposal.tree_expected)


def verify_tree(
    target: Runner,
    slots: Slots,
    start: int,
    proposal: Proposal,
    selector: TokenSelector,
    generator: torch.Generator | None,
) -> Verification:
    """One target pass over the pending token and the proposal's token tree (`engine.token_tree`), then the tree
    rule (`engine.acceptance.tree_accept`): the n accepted nodes' tokens are written at columns [start, start + n),
    the target's cache keeps them at those positions, and the round commits them as a chain of n drafts (logits and
    processed scores [1, n + 1, V] along the path)."""
    tree = proposal.tree
    root = slots.ids[:, start - 1 : start]  # [1, 1]
    nodes = torch.tensor([tree.tokens], dtype=root.dtype, device=root.device)  # [1, N]
    tokens = torch.cat([root, nodes], dim=1)  # [1, N + 1]
    logits = target.forward_tree(tokens, tree)  # [1, N + 1, V]
    prefix = slots.through(start)  # [1, start]: ends with the root
    scored: dict[int, torch.Tensor] = {}

    def scores_at(query: int, path: list[int]) -> torch.Tensor:
        context = torch.cat([prefix, tokens[:, path[1:]]], dim=1)  # ends with the query's token
        scored[query] = selector.scores(logits[:, query : query + 1], context)  # [1, 1, V]
        return scored[query][0, 0]

    path, token = tree_accept(tree.children(), tokens[0].tolist(), scores_at, selector.do_sample, generator)
    n = len(path)
    if n:  # the accepted path, laid out as a chain of drafts
        slots.write_draft(start, tokens[0, path], slot=0)
    target.keep_path(start - 1, path)
    kept = [0] + path
    device = root.device
    accepted = torch.tensor([n], device=device)
    next_token = torch.tensor([token], dtype=root.dtype, device=device)
    scores = torch.cat([scored[query] for query in kept], dim=1)
    # the path's depth (at most γ) is what the schedule's model sees
    return Verification.tree_path(accepted, next_token, logits[:, kept], scores, n, tree.size, max(proposal.count, n))


def commit(state: DecodingState, start: int, verification: Verification) -> tuple[list[int], dict[int, int]]:
    """Write y_b after each row's n_b accepted drafts and commit every generating row's tokens, to its limit and
    through its first EOS or stop: (n per slot, the count each generating row kept).

    The span [B, m = γ + 1] holds the γ drafts from column `start`, then scratch; the logits [B, m', V] with m' ≤ m
    (the head on demand computes fewer: positions past them lie past n, never committed)."""
    slots, settings = state.slots, state.settings
    accepted, logits, scores = verification.accepted, verification.logits, verification.scores
    live = slots.live()
    remaining = {b: slots.remaining(b) for b in live}
    # [B, m]: the drafts, then scratch; y_b after the n_b accepted drafts
    span = slots.place_target_tokens(start, accepted, verification.next_token, verification.drafts)
    stops = None
    if settings.stop is not None:
        stops = settings.stop.hits(slots.ids, start, logits.shape[1], logits, slots.row_starts())
        stops = torch.nn.functional.pad(stops, (0, span.shape[1] - logits.shape[1]), value=False)
    n, ends, tokens = _outcome(accepted, span, settings.eos_token_ids, stops, settings.on_commit is not None)
    kept = {b: min(n[b] + 1, remaining[b], ends[b] + 1) for b in live}
    done = {b: ends[b] < kept[b] or kept[b] == remaining[b] for b in live}
    if settings.record is not None:  # the logits behind the tokens each row commits
        for b, count in kept.items():
            settings.record.add(slots.caller_rows[b], logits[b], scores[b], count)
    slots.commit(kept, done, start, scores)  # log-probabilities from `scores` where the slots keep them
    if settings.prefix is not None:  # rows that ended: their committed tokens into the prefix cache
        for b in (b for b in live if done[b]):
            settings.prefix.keep_finished(slots, b, start + kept[b])
    if settings.on_commit is not None:
        settings.on_commit(tokens[: kept[0]])  # committed tokens only: never a rejected draft token
    return n, kept


def _outcome(
    accepted: torch.Tensor,
    span: torch.Tensor,
    eos_token_ids: torch.Tensor | None,
    stops: torch.Tensor | None,
    with_tokens: bool,
) -> tuple[list[int], list[int], list[int]]:
    """(n, e, tokens): per row the accepted count and the index in `span` [B, m] of the first EOS or stop
    among its n + 1 new tokens (m when there is none) and, when asked, row 0's span tokens, read from the
    device in one transfer: the round's only host sync. `stops` [B, m]: where a stopping criterion fires."""
    batch, m = span.shape
    if eos_token_ids is None and stops is None and not with_tokens:
        return accepted.tolist(), [m] * batch, []
    positions = torch.arange(m, device=span.device)
    hits = torch.zeros_like(span, dtype=torch.bool)  # [B, m]
    if eos_token_ids is not None:
        hits = hits | torch.isin(span, eos_token_ids)
    if stops is not None:
        hits = hits | stops
    hits = hits & (positions[None, :] <= accepted[:, None])
    first = torch.where(hits.any(dim=1), hits.long().argmax(dim=1), m)  # [B]
    parts = [accepted, first] + ([span[0]] if with_tokens else [])
    values = torch.cat(parts).tolist()
    return values[:batch], values[batch : 2 * batch], values[2 * batch :]

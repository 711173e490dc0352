"""One round of assisted decoding: draft γ → verify γ + 1 → accept n → commit n + 1 → roll back the rest.

Notation (Leviathan et al. 2023, Chen et al. 2023; glossary in docs/design.md). A round starts with L committed
tokens in the buffer, the newest (column L − 1) pending: the target's cache holds columns [0, L − 1). The
drafter writes x_1..x_γ at columns [L, L + γ); the target scores the pending token and the drafts in one pass
(m = γ + 1 positions); each row b accepts n_b ≤ γ drafts (greedy: the longest prefix equal to the target's
argmax; sampling: the rejection rule of `engine.acceptance`) and gets the target's own token y_b after them.
Each row commits min(n_b + 1, what it has left, through its first EOS or stop); the target's cache and the
drafter's roll back to the committed tokens, the newest pending again. The prompt pass commits through the
same `commit`, as a round with no draft (n = 0).

Collaborators, not branches: `LiveRows` (batches: which rows generate, realignment), the drafter behind its
guard (`GuardedDrafter`), `HeadSplit` (greedy: the head on demand), and the settings' `stop`, `record` and
`on_commit` (stop strings, kept logits, streaming).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from assisted_backends.engine.acceptance import greedy_accept, speculative_accept, tree_accept
from assisted_backends.engine.drafter import GuardedDrafter, Proposal
from assisted_backends.engine.head_on_demand import HeadSplit, greedy_accept_on_demand
from assisted_backends.engine.joins import Refill
from assisted_backends.engine.outputs import CommittedScores
from assisted_backends.engine.rows import LiveRows
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector, sample
from assisted_backends.engine.schedule import RoundObservation
from assisted_backends.engine.stopping import StopCheck
from assisted_backends.engine.token_tree import TokenTree
from assisted_backends.engine.tokens import RowStarts, TokenBuffer


@dataclass
class LoopSettings:
    """What the call asks of every round (and of the loop: `synchronize`, `refill`)."""

    max_new_tokens: int
    eos_token_ids: torch.Tensor | None  # [E] or None
    static_shapes: bool  # always draft γ, always verify γ + 1
    synchronize: Callable[[], None]
    stop: StopCheck | None = None  # stop strings / custom criteria, checked on every candidate prefix
    on_commit: Callable[[list[int]], None] | None = None  # receives the committed tokens of each round
    record: CommittedScores | None = None  # keeps the logits behind each committed token
    refill: Refill | None = None  # a queue of prompts taking the slots of rows that end (`engine.joins`)

    def limit(self, row: int) -> int:
        """The new-token limit of caller row `row`: a live queue's row may have its own (`Refill.limits`)."""
        return self.refill.limit(row, self.max_new_tokens) if self.refill is not None else self.max_new_tokens


def speculative_round(
    gamma: int,
    target: ModelRunner,
    drafter: GuardedDrafter,
    buffer: TokenBuffer,
    rows: LiveRows,
    selector: TokenSelector,
    generator: torch.Generator | None,
    settings: LoopSettings,
    split: HeadSplit | None,
    reserve: int,
) -> RoundObservation:
    """One round asking for γ draft tokens (γ = 0: a plain step); what it cost and yielded, for the schedule."""
    start, positions = buffer.length, rows.positions()  # L; the rows generating
    if gamma > 0 and not drafter.ready(buffer):  # the drafter's first look at the committed tokens
        gamma = 0
    began = time.perf_counter()
    proposal = drafter.propose(buffer, gamma, selector, generator)  # x_1..x_γ' at columns [L, L + γ')
    if settings.static_shapes and drafter.active and proposal.count != gamma:
        raise RuntimeError(f"{drafter.name} proposed {proposal.count} tokens; static shapes need exactly {gamma}")
    drafter.note_stop(buffer, rows.total)
    draft = buffer.ids[:, start : start + proposal.count]  # [B, γ']
    drafted_at = time.perf_counter()
    drafted = scheduled = draft.shape[1]  # nodes verified (statistics); the chain's γ (the schedule's model)
    rows_fed = draft.shape[1] + 1
    if _tree_wanted(proposal, target, buffer, settings, start):  # one row, dynamic cache: the path, then a chain
        accepted, next_token, logits, scores = verify_tree(target, buffer, start, proposal.tree, selector, generator)
        drafted, rows_fed = proposal.tree.size, proposal.tree.size + 1
        scheduled = max(proposal.count, int(accepted[0]))  # the path's depth: at most γ
        target.tree_price.trees += 1
        draft = buffer.ids[:, start : start + int(accepted[0])]  # the accepted path, written over the chain
    else:
        accepted, next_token, logits, scores = verify(
            target, buffer, start, draft, proposal, selector, generator, split
        )
    rows.total.head_positions_skipped += draft.shape[1] + 1 - logits.shape[1]
    n, kept = commit(buffer, rows, settings, start, draft.shape[1], accepted, next_token, logits, scores)
    verified_at = time.perf_counter()
    rows.record_round(buffer, positions, drafted, n)
    rows.settle(buffer, target, drafter, start, n, kept, reserve)  # batches: realign the rows
    target.rollback(buffer.length - 1)  # the newest committed token stays pending
    if gamma > 0:
        drafter.rollback(buffer)
    drafter.note_stop(buffer, rows.total)
    # batches: the verify cost includes realigning the rows (it grows with γ too)
    verify_s = (time.perf_counter() if buffer.batched else verified_at) - drafted_at
    if not buffer.batched and gamma > 0:
        target.tree_price.observe(rows_fed, verify_s)  # chain or tree: priced by the rows a pass feeds
    row_accepted = tuple(n[b] for b in positions) if buffer.batched else ()
    accepted_total = sum(n[b] for b in positions)
    return RoundObservation(scheduled, accepted_total, drafted_at - began, verify_s, row_accepted, len(n))


def prefill(
    target: ModelRunner,
    buffer: TokenBuffer,
    rows: LiveRows,
    selector: TokenSelector,
    generator: torch.Generator | None,
    settings: LoopSettings,
) -> None:
    """The prompt pass: the target reads the committed tokens and chooses every row's first token, committed
    as a round with no draft (n = 0). The drafter sees nothing yet (`GuardedDrafter.ready`)."""
    start = buffer.length
    logits = target.forward(buffer.committed(), last_only=True)[:, -1:]  # [B, 1, V]
    first, scores = choose_first(logits, buffer.committed(), selector, generator, buffer.row_starts())
    commit(buffer, rows, settings, start, 0, torch.zeros_like(first), first, logits, scores)
    buffer.length = start + 1


def choose_first(
    logits: torch.Tensor,
    context: torch.Tensor,
    selector: TokenSelector,
    generator: torch.Generator | None,
    rows: RowStarts | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the token after `context` [B], its processed scores [B, 1, V]) from the last position's `logits`."""
    scores = selector.scores(logits, context, rows)
    if selector.do_sample:
        return sample(torch.softmax(scores, dim=-1), generator)[:, -1], scores
    return scores.argmax(dim=-1)[:, -1], scores


def verify(
    target: ModelRunner,
    buffer: TokenBuffer,
    start: int,
    draft: torch.Tensor,
    proposal: Proposal,
    selector: TokenSelector,
    generator: torch.Generator | None,
    split: HeadSplit | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One target pass over the pending token and the γ draft tokens: (n [B], y [B], logits [B, m, V],
    processed scores [B, m, V] or None).

    m = γ + 1, except when the head runs on demand (greedy, `split` given and wanting it): then the
    logits of position 1 come first and the rest only if some row accepted x_1 (`engine.head_on_demand`),
    and no scores are returned.
    """
    gamma = draft.shape[1]
    tokens = buffer.ids[:, target.length : start + gamma]  # [B, γ+1]
    rows = buffer.row_starts()
    if split is not None and gamma > 0 and split.wanted():
        hidden = target.forward(tokens, hidden_only=True)  # [B, γ+1, D]

        def choose(logits: torch.Tensor, end: int) -> torch.Tensor:
            return selector.greedy(logits, buffer.through(start + end - 1), rows)

        return *greedy_accept_on_demand(draft, hidden, target.head, choose, split), None
    logits = target.forward(tokens)  # [B, γ+1, V]
    scores = selector.scores(logits, buffer.through(start + gamma), rows)  # [B, γ+1, V]
    if not selector.do_sample:
        accepted, next_token = greedy_accept(draft, scores.argmax(dim=-1))
        if split is not None and gamma > 0:
            split.record_outcome(bool((accepted > 0).any()))
        return accepted, next_token, logits, scores
    p = torch.softmax(scores, dim=-1)  # [B, γ+1, V]
    if gamma > 0:
        accepted, next_token = speculative_accept(draft, proposal.q, p, generator)
        return accepted, next_token, logits, scores
    return torch.zeros(p.shape[0], dtype=torch.long, device=p.device), sample(p[:, -1], generator), logits, scores


def _tree_wanted(
    proposal: Proposal, target: ModelRunner, buffer: TokenBuffer, settings: LoopSettings, start: int
) -> bool:
    """Whether this round verifies the proposal's token tree rather than its chain: a tree with branches, one row,
    no fixed shapes or queue, a runner that can (`ModelRunner.tree_refusal`); else the chain, as always."""
    tree = proposal.tree
    if tree is None or tree.size <= proposal.count or buffer.batched or settings.static_shapes:
        return False
    if settings.refill is not None or target.feature_tap is not None or target.length != start - 1:
        return False  # queues; drafters reading the target's hidden states (EAGLE) see chains only
    if target.tree_refusal() is not None:
        return False
    if proposal.tree_expected is None:
        return True
    return target.tree_price.worth(proposal.count + 1, tree.size + 1, *proposal.tree_expected)


def verify_tree(
    target: ModelRunner,
    buffer: TokenBuffer,
    start: int,
    tree: TokenTree,
    selector: TokenSelector,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One target pass over the pending token and a token tree (`engine.token_tree`), then the tree rule
    (`engine.acceptance.tree_accept`): the n accepted nodes' tokens are written at columns [start, start + n), the
    target's cache keeps them at those positions, and the round commits them as a chain of n drafts:
    (n [1], y [1], logits [1, n + 1, V], processed scores [1, n + 1, V]) along the path."""
    root = buffer.ids[:, start - 1 : start]  # [1, 1]
    nodes = torch.tensor([tree.tokens], dtype=root.dtype, device=root.device)  # [1, N]
    tokens = torch.cat([root, nodes], dim=1)  # [1, N + 1]
    logits = target.forward_tree(tokens, tree)  # [1, N + 1, V]
    prefix = buffer.through(start)  # [1, start]: ends with the root
    scored: dict[int, torch.Tensor] = {}

    def scores_at(row: int, path: list[int]) -> torch.Tensor:
        context = torch.cat([prefix, tokens[:, path[1:]]], dim=1)  # ends with row's token
        scored[row] = selector.scores(logits[:, row : row + 1], context)  # [1, 1, V]
        return scored[row][0, 0]

    path, token = tree_accept(tree.children(), tokens[0].tolist(), scores_at, selector.do_sample, generator)
    n = len(path)
    if n:
        buffer.ids[0, start : start + n] = tokens[0, path]
    target.keep_path(start - 1, path)
    kept = [0] + path
    device = root.device
    accepted = torch.tensor([n], device=device)
    next_token = torch.tensor([token], dtype=root.dtype, device=device)
    return accepted, next_token, logits[:, kept], torch.cat([scored[row] for row in kept], dim=1)


def commit(
    buffer: TokenBuffer,
    rows: LiveRows,
    settings: LoopSettings,
    start: int,
    gamma: int,
    accepted: torch.Tensor,
    next_token: torch.Tensor,
    logits: torch.Tensor,
    scores: torch.Tensor | None,
) -> tuple[list[int], dict[int, int]]:
    """Write y_b after each row's n_b accepted drafts and commit every generating row's tokens, to its limit and
    through its first EOS or stop: (n per batch position, the count each generating row kept).

    The span [B, m = γ + 1] holds the γ drafts from column `start`, then scratch; `logits` [B, m', V] with m' ≤ m
    (the head on demand computes fewer: positions past them lie past n, never committed)."""
    positions = rows.positions()
    remaining = {b: settings.limit(buffer.caller_rows[b]) - buffer.new_tokens[b] for b in positions}
    span = buffer.ids[:, start : start + gamma + 1]  # [B, m]: the drafts, then scratch
    span.scatter_(1, accepted[:, None], next_token[:, None])  # y_b after the n_b accepted drafts
    stops = None
    if settings.stop is not None:
        stops = settings.stop.hits(buffer.ids, start, logits.shape[1], logits, buffer.row_starts())
        stops = torch.nn.functional.pad(stops, (0, span.shape[1] - logits.shape[1]), value=False)
    n, ends, tokens = _outcome(accepted, span, settings.eos_token_ids, stops, settings.on_commit is not None)
    kept = {b: min(n[b] + 1, remaining[b], ends[b] + 1) for b in positions}
    done = {b: ends[b] < kept[b] or kept[b] == remaining[b] for b in positions}
    if settings.record is not None:  # the logits behind the tokens each row commits
        for b, count in kept.items():
            settings.record.add(buffer.caller_rows[b], logits[b], scores[b], count)
    rows.commit(buffer, kept, done, start)
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

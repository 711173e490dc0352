"""Verification: how many of the γ draft tokens the target keeps, and the token it adds.

Notation (Leviathan et al. 2023, algorithm 1): draft tokens x_1..x_γ were sampled from the draft's
distributions q_1..q_γ; the target's single forward pass gives p_1..p_{γ+1}. All functions keep the
batch dimension B and never leave the device, so the accepted count needs no host sync to compute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from assisted_backends.engine.sampling import sample


@dataclass(frozen=True, kw_only=True)
class Verification:
    """What one target pass decided, in one shape whichever way it verified (greedy, sampling, the head on demand, a
    token tree, or the prompt pass with nothing drafted): per row n_b drafts accepted (`accepted` [B]) and the
    target's own token y_b after them (`next_token` [B]); the raw `logits` [B, m', V] and processed `scores`
    [B, m', V] (None when the head ran on demand) of the positions computed, m' ≤ m = `drafts` + 1.

    `drafts`: the draft tokens laid out as a chain from the round's first column (a tree: its accepted path);
    `verified`: the draft tokens the pass scored (the statistics' drafted: a tree's nodes); `scheduled`: the chain's
    γ the schedule's model sees; `fed`: positions the pass fed (what it is priced by); `tree`: a token tree. Built by
    name: `chain` or `tree_path` (every field a keyword)."""

    accepted: torch.Tensor
    next_token: torch.Tensor
    logits: torch.Tensor
    scores: torch.Tensor | None
    drafts: int
    verified: int
    scheduled: int
    fed: int
    tree: bool = False

    @classmethod
    def chain(
        cls, accepted: torch.Tensor, next_token: torch.Tensor, logits: torch.Tensor, scores: torch.Tensor | None,
        gamma: int,
    ) -> Verification:  # fmt: skip
        """A chain of γ drafts (γ = 0: the prompt pass or a plain round): γ verified and scheduled, γ + 1 fed."""
        return cls(accepted=accepted, next_token=next_token, logits=logits, scores=scores, drafts=gamma,
                   verified=gamma, scheduled=gamma, fed=gamma + 1)  # fmt: skip

    @classmethod
    def tree_path(
        cls, accepted: torch.Tensor, next_token: torch.Tensor, logits: torch.Tensor, scores: torch.Tensor,
        depth: int, nodes: int, scheduled: int,
    ) -> Verification:  # fmt: skip
        """A token tree of `nodes` nodes whose accepted path is `depth` deep (laid out as a chain of `depth` drafts);
        the root and the nodes fed; `scheduled`: the γ the schedule's model sees."""
        return cls(accepted=accepted, next_token=next_token, logits=logits, scores=scores, drafts=depth,
                   verified=nodes, scheduled=scheduled, fed=nodes + 1, tree=True)  # fmt: skip

    @property
    def skipped(self) -> int:
        """Verified positions whose logits were never computed (`engine.head_on_demand`)."""
        return self.drafts + 1 - self.logits.shape[1]


def leading_true(matches: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row of `matches` [B, γ] -> [B] (long)."""
    return matches.long().cumprod(dim=-1).sum(dim=-1)


def greedy_accept(draft: torch.Tensor, target_choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification.

    draft [B, γ], target_choice [B, γ+1] (the target's argmax after each prefix).
    Returns n [B], the longest prefix where draft == target, and the next token target_choice[:, n].
    """
    n = leading_true(draft == target_choice[:, :-1])
    next_token = target_choice.gather(1, n[:, None]).squeeze(1)
    return n, next_token


def acceptance_probability(p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)) for the drafted tokens x (both arguments gathered at x)."""
    return torch.clamp(p_draft / q_draft, max=1.0)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)) over the last dimension.

    Guard (docs/design.md rule 3): where p ≈ q the residual sums to zero; rejection then has probability
    zero in exact arithmetic and only rounding reaches it, so p itself is returned there.
    """
    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum(dim=-1, keepdim=True)
    safe = total > torch.finfo(p.dtype).tiny
    return torch.where(safe, residual / torch.where(safe, total, torch.ones_like(total)), p)


def speculative_accept(
    draft: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling.

    draft [B, γ], q [B, γ, V], p [B, γ+1, V]. Accept x_i while u_i < min(1, p_i(x_i)/q_i(x_i));
    at the first rejection i sample from norm(max(0, p_i − q_i)); if all γ pass, sample the bonus
    token from p_{γ+1}. Returns n [B] accepted and the next token [B].
    """
    batch, gamma = draft.shape
    p_draft = p[:, :gamma, :].gather(-1, draft[..., None]).squeeze(-1)  # [B, γ]
    q_draft = q.gather(-1, draft[..., None]).squeeze(-1)  # [B, γ]
    u = torch.rand((batch, gamma), generator=generator, device=p.device, dtype=p.dtype)
    n = leading_true(u < acceptance_probability(p_draft, q_draft))  # [B]

    # Distribution of the next token: residual at the first rejection, p_{γ+1} when all passed.
    at_n = n[:, None, None].expand(batch, 1, p.shape[-1])  # each row's position n
    p_n = p.gather(1, at_n).squeeze(1)  # [B, V]
    q_n = q.gather(1, at_n.clamp(max=gamma - 1)).squeeze(1) * (n < gamma)[:, None]  # [B, V]; q_{γ+1} = 0
    next_distribution = residual_distribution(p_n, q_n)  # equals p_{γ+1} when n == γ
    return n, sample(next_distribution, generator)


def tree_accept(
    children: list[list[int]],
    tokens: list[int],
    scores_at: Callable[[int, list[int]], torch.Tensor],
    do_sample: bool,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Token trees (`engine.token_tree`): walk from the root (query 0) down the queries the target keeps.

    `children[r]`: query r's child queries; `tokens[r]`: the token of query r (query 0: the pending one);
    `scores_at(r, path)`: the target's processed scores [V] after query r, `path` the queries from the root to r.
    Greedy: follow the child whose token is argmax(scores_r); stop where none is. Sampling (drafts are point masses):
    with residual ρ = p_r, try each child c in turn, accept with probability ρ(x_c) (= min(1, ρ(x_c)/q(x_c)),
    q = δ_{x_c}), else ρ ← norm(ρ with x_c removed), i.e. norm(max(0, ρ − δ_{x_c})) (SpecInfer's recursive rejection);
    after every child is rejected sample from ρ. The token added is then distributed as p_r exactly. Returns (the
    accepted queries, root excluded; the next token).
    """
    path: list[int] = []
    query = 0
    while True:
        scores = scores_at(query, [0] + path)  # [V]
        if not do_sample:
            choice = int(scores.argmax())
            child_node = next((c for c in children[query] if tokens[c] == choice), None)
            if child_node is None:
                return path, choice
            path.append(child_node)
            query = child_node
            continue
        residual = torch.softmax(scores, dim=-1)
        child_node = None
        for child in children[query]:
            u = torch.rand((), generator=generator, device=residual.device, dtype=residual.dtype)
            if u < residual[tokens[child]]:
                child_node = child
                break
            removed = residual.clone()
            removed[tokens[child]] = 0.0
            residual = residual_distribution(residual, residual - removed)
        if child_node is None:
            return path, int(sample(residual, generator))
        path.append(child_node)
        query = child_node

"""Token trees (SpecInfer, Miao et al. 2024): several draft continuations verified in one target pass.

A tree of N draft nodes hangs below the pending token (the root). Its verify pass feeds N + 1 query positions
("queries"): query 0 the root, query i + 1 node i; every node's parent comes before it. Query r sits at position
prefix + depth(r) and sees the prefix and its own ancestors (itself included) only: `attention_mask` builds that 4-D
mask. After the acceptance rule (`engine.acceptance.tree_accept`) picks a path, the cache keeps that path's queries
only, moved to
consecutive positions (`engine.cache_surgery.keep_cache_positions`), and the round commits it as a chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenTree:
    """Draft nodes: `tokens[i]` with parent `parents[i]` (−1: the root, else an earlier node). Nodes 0..k−1 may be
    the chain the slots hold (each the child of the one before); siblings carry distinct tokens."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("TokenTree: tokens and parents must have the same length")
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"TokenTree: node {i}'s parent {parent} must be −1 or an earlier node")

    @classmethod
    def from_paths(cls, paths: list[list[int]]) -> TokenTree:
        """The trie of `paths` (shared prefixes merged), nodes in the order first met (paths[0] first, a chain)."""
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}
        for path in paths:
            parent = -1
            for token in path:
                key = (parent, token)
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                parent = index[key]
        return cls(tuple(tokens), tuple(parents))

    @property
    def size(self) -> int:
        return len(self.tokens)

    def query_parents(self) -> list[int]:
        """The parent query of each query (query 0, the root, has none: −1)."""
        return [-1] + [parent + 1 for parent in self.parents]

    def depths(self) -> list[int]:
        """Depth of each query: 0 for the root, 1 for its children, …"""
        depth = [0]
        for parent in self.parents:
            depth.append(depth[parent + 1] + 1)
        return depth

    def children(self) -> list[list[int]]:
        """The child queries of each query, in node order."""
        found: list[list[int]] = [[] for _ in range(self.size + 1)]
        for query, parent in enumerate(self.query_parents()[1:], start=1):
            found[parent].append(query)
        return found

    def chain_length(self) -> int:
        """How many leading nodes form a chain from the root (node i the child of node i − 1)."""
        length = 0
        while length < self.size and self.parents[length] == length - 1:
            length += 1
        return length

    def visible(self) -> torch.Tensor:
        """[N + 1, N + 1] bool: query r sees query c iff c is r or one of its ancestors."""
        queries = self.size + 1
        seen = torch.zeros(queries, queries, dtype=torch.bool)
        for query, parent in enumerate(self.query_parents()):
            if parent >= 0:
                seen[query] = seen[parent]
            seen[query, query] = True
        return seen


def attention_mask(tree: TokenTree, prefix: int, implementation: str | None, dtype: torch.dtype) -> torch.Tensor:
    """The 4-D mask [1, 1, N + 1, prefix + N + 1] of a tree's verify pass on top of `prefix` cached positions, in
    the form transformers' attention `implementation` takes a ready mask in: boolean (True: attend) for SDPA and
    the batch-invariant attention, additive (0 or the dtype's minimum) for eager."""
    queries = tree.size + 1
    mask = torch.cat([torch.ones(queries, prefix, dtype=torch.bool), tree.visible()], dim=1)[None, None]
    if implementation == "eager":
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


MASK_IMPLEMENTATIONS = ("sdpa", "eager", "assisted_batch_invariant")  # those `attention_mask` serves

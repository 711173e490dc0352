"""The token-level vocabulary intersection of two tokenizers (Timor et al., ICML 2025, "Accelerating LLM
Inference with Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies").

A draft token d and a target token t are shared when they spell the same bytes, b(d) = b(t). The
draft samples only shared tokens, from q restricted to the intersection I and renormalised:

    q_I(d) = q(d) 1[d ∈ I] / Σ_{d' ∈ I} q(d'),

and its draw d stands for the target token m(d). The distribution over the *target* vocabulary it
was drawn from is q_T(t) = Σ_{d: m(d) = t} q_I(d), zero outside m(I). Rejection sampling with p and
q_T is then the ordinary lossless rule: any q_T gives exactly p; the intersection only decides how
often drafts are accepted.
"""

from __future__ import annotations

import torch

from assisted_backends.drafters.any_pair.token_bytes import ByteCodec


class VocabIntersection:
    """Shared tokens of a draft and a target vocabulary, and the maps between them.

    draft_vocab / target_vocab are the models' logit widths (they may exceed the tokenizers' sizes).
    """

    def __init__(self, draft: ByteCodec, target: ByteCodec, draft_vocab: int, target_vocab: int) -> None:
        target_of_bytes: dict[bytes, int] = {}
        for token_id, data in enumerate(target.token_bytes[:target_vocab]):
            if data is not None:
                target_of_bytes.setdefault(data, token_id)
        pairs = [
            (d, target_of_bytes[data])
            for d, data in enumerate(draft.token_bytes[:draft_vocab])
            if data is not None and data in target_of_bytes
        ]
        if not pairs:
            raise ValueError(
                "the draft and target tokenizers share no token, so a draft cannot be sampled losslessly; "
                "use greedy decoding (do_sample=False) or a draft whose vocabulary overlaps the target's"
            )
        self.draft_vocab = draft_vocab
        self.target_vocab = target_vocab
        self.draft_ids = torch.tensor([d for d, _ in pairs])  # [K]
        self.target_ids = torch.tensor([t for _, t in pairs])  # [K]
        self.target_of = torch.full((draft_vocab,), -1, dtype=torch.long)  # m: [V_d] -> target id or -1
        self.target_of[self.draft_ids] = self.target_ids
        self.draft_mask = self.target_of >= 0  # [V_d]

    def __len__(self) -> int:
        return int(self.draft_ids.numel())

    def to(self, device: torch.device) -> VocabIntersection:
        self.draft_ids, self.target_ids = self.draft_ids.to(device), self.target_ids.to(device)
        self.target_of, self.draft_mask = self.target_of.to(device), self.draft_mask.to(device)
        return self

    def restrict(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, V_d] -> (q_I [B, V_d], mass [B]): q on the intersection, renormalised; mass = q(I) before."""
        restricted = q * self.draft_mask
        mass = restricted.sum(dim=-1)
        safe = torch.where(mass > 0, mass, torch.ones_like(mass))
        return restricted / safe[:, None], mass

    def to_target(self, q_restricted: torch.Tensor) -> torch.Tensor:
        """q_I [B, V_d] -> q_T [B, V_target]: each shared draft token's mass moved to its target token."""
        q_target = torch.zeros(
            q_restricted.shape[0], self.target_vocab, dtype=q_restricted.dtype, device=q_restricted.device
        )
        return q_target.index_add_(1, self.target_ids, q_restricted[:, self.draft_ids])


def intersection_of(draft: ByteCodec, target: ByteCodec, draft_vocab: int, target_vocab: int) -> VocabIntersection:
    """`VocabIntersection(...)`, remembered on the draft's codec (building it walks both vocabularies)."""
    memo = draft.__dict__.setdefault("_intersections", {})
    key = (id(target), draft_vocab, target_vocab)
    if key not in memo or memo[key][0] is not target:
        memo[key] = (target, VocabIntersection(draft, target, draft_vocab, target_vocab))
    return memo[key][1]

"""Training-time test (EAGLE-3): the head unrolled K steps over whole sequences at once, as it drafts.

Sequences are right-padded, [B, T]: tokens x_t, the target's features f_t and its next-token distribution
p_t (top-k) at every position t < T_b. Step k (k = 0..K−1) evaluates, for every anchor t at once, the column
t + k of a chain that started after the target's features of column t:

    step 0:  a = g_t = fc(f_t),        token x_{t+1},     position t,      predicts x_{t+2}  (label p_{t+1})
    step k:  a = o^{(k−1)}_t,           token x_{t+1+k},   position t + k,  predicts x_{t+2+k} (label p_{t+1+k})

and attends to step-0 keys at columns s ≤ t (the columns the target's features built) and to its own chain's
keys at t + 1 .. t + k (steps 1..k at anchor t): exactly what `EagleDrafter` attends to when it drafts k + 1
tokens after column t. The loss is the cross-entropy against the target's distribution restricted to the
draft vocabulary (where the target's choice has a draft id), step k weighted by 0.8^k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from assisted_backends.drafters.eagle.head import Eagle3Head


@dataclass
class Batch:
    """Right-padded training sequences. `labels` [B, T, k] draft ids of the target's top-k at each position
    (−1: no draft id), `probs` [B, T, k] their probabilities; `choice` [B, T] the target's argmax as a draft id
    (−1: none); `lengths` [B]; `starts` [B]: the first position whose token the target generated."""

    tokens: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    probs: torch.Tensor
    choice: torch.Tensor
    lengths: torch.Tensor
    starts: torch.Tensor


def _shift(tensor: torch.Tensor, by: int, fill) -> torch.Tensor:
    """tensor[:, t + by] at t (fill past the end)."""
    if by == 0:
        return tensor
    tail = torch.full_like(tensor[:, :by], fill)
    return torch.cat([tensor[:, by:], tail], dim=1)


class StepAttention:
    """Attention of step k over the step-0 keys (causal) and the steps 1..k keys at the same anchor."""

    def __init__(self, valid_keys: torch.Tensor) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.valid_keys = valid_keys  # [B, T] positions holding a real token

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys.append(k)
        self.values.append(v)
        groups = q.shape[1] // k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        k0 = self.keys[0].repeat_interleave(groups, dim=1)  # [B, h, T, d]
        v0 = self.values[0].repeat_interleave(groups, dim=1)
        length = q.shape[2]
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()  # [T, T]
        allowed = causal[None, None] & self.valid_keys[:, None, None, :]
        allowed = allowed | torch.eye(length, dtype=torch.bool, device=q.device)[None, None]
        scores = (q @ k0.transpose(-1, -2)) * scale  # [B, h, T, T]
        scores = scores.masked_fill(~allowed, float("-inf"))
        diagonal = [
            ((q * key.repeat_interleave(groups, dim=1)).sum(-1) * scale)[..., None]  # [B, h, T, 1]
            for key in self.keys[1:]
        ]
        weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
        out = weights[..., :length] @ v0
        for i, value in enumerate(self.values[1:]):
            out = out + weights[..., length + i : length + i + 1] * value.repeat_interleave(groups, dim=1)
        return out


@dataclass
class StepResult:
    """Per step k: the loss terms' sum and count, and the greedy agreement counts on the chosen anchors."""

    loss: torch.Tensor
    positions: int
    agreed: list[torch.Tensor]  # [B, T] bool per step: the head's argmax equals the target's choice
    valid: list[torch.Tensor]  # [B, T] bool per step: a label exists


def unroll(head: Eagle3Head, batch: Batch, steps: int, decay: float = 0.8) -> StepResult:
    """Run `steps` TTT steps; return the weighted loss (mean over labelled positions per step, summed over steps)."""
    b, length = batch.tokens.shape
    positions = torch.arange(length, device=batch.tokens.device)[None, :].expand(b, -1)
    real = positions < batch.lengths[:, None]  # [B, T]
    attention = StepAttention(real)
    hidden = head.fuse(batch.features)
    total = hidden.new_zeros(())
    count = 0
    agreed, valid = [], []
    for k in range(steps):
        tokens = _shift(batch.tokens, 1 + k, 0)
        out = head(tokens, hidden, positions + k, attention)  # [B, T, H]
        logits = head.draft_logits(out).float()  # [B, T, V_d]
        labels = _shift(batch.labels, 1 + k, -1)  # [B, T, topk]
        probs = _shift(batch.probs, 1 + k, 0.0)
        choice = _shift(batch.choice, 1 + k, -1)  # [B, T]
        ok = (positions + 1 + k < batch.lengths[:, None]) & (choice >= 0)  # [B, T]
        probs = probs * (labels >= 0)
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
        log_q = torch.log_softmax(logits, dim=-1).gather(-1, labels.clamp_min(0))  # [B, T, topk]
        per_position = -(probs * log_q).sum(-1)  # [B, T]
        labelled = int(ok.sum())
        if labelled:
            total = total + (decay**k) * per_position[ok].sum() / labelled
        count += labelled
        agreed.append((logits.argmax(-1) == choice) & ok)
        valid.append(ok)
        hidden = out
    return StepResult(total, count, agreed, valid)


def chain_acceptance(result: StepResult, starts: torch.Tensor) -> list[float]:
    """α_k for k = 1..K: P(draft token k agrees with the target's | tokens 1..k−1 did), over anchors t whose
    next token was generated by the target (t + 1 ≥ start), teacher-forced: what greedy chain drafting gets."""
    anchors = result.valid[0]
    b, length = anchors.shape
    generated = torch.arange(length, device=anchors.device)[None, :] + 1 >= starts[:, None]
    alive = anchors & generated
    rates = []
    for agreed, valid in zip(result.agreed, result.valid):
        alive = alive & valid
        tried = int(alive.sum())
        alive = alive & agreed
        rates.append(int(alive.sum()) / tried if tried else 0.0)
    return rates


def expected_tokens(rates: list[float], gamma: int) -> float:
    """E(γ) = 1 + Σ_{k≤γ} Π_{i≤k} α_i: tokens per round of greedy chain drafting, the target's own included."""
    total, product = 1.0, 1.0
    for rate in rates[:gamma]:
        product *= rate
        total += product
    return total

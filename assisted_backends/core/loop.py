"""The assisted-decoding loop: prefill -> [draft γ -> verify γ+1 -> accept -> commit/rollback]*.

With no drafter (or γ = 0) the same loop is plain autoregressive decoding, so both modes are
measured through one code path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from assisted_backends.core.acceptance import greedy_accept, speculative_accept
from assisted_backends.core.drafters import Drafter, Proposal
from assisted_backends.core.runner import ModelRunner
from assisted_backends.core.sampling import TokenSelector, sample
from assisted_backends.core.schedule import DraftSchedule, RoundObservation
from assisted_backends.core.stats import GenerationStats
from assisted_backends.core.tokens import TokenBuffer


@dataclass
class LoopSettings:
    max_new_tokens: int
    eos_token_ids: torch.Tensor | None  # [E] or None
    fixed_draft_length: bool  # static shapes: always draft γ, always verify γ + 1
    synchronize: Callable[[], None]


def _choose_first(logits: torch.Tensor, context: torch.Tensor, selector: TokenSelector, generator) -> torch.Tensor:
    if selector.do_sample:
        return sample(selector.probabilities(logits, context), generator)[:, -1]
    return selector.greedy(logits, context)[:, -1]


def _commit_count(new_tokens: torch.Tensor, eos_token_ids: torch.Tensor | None) -> tuple[int, bool]:
    """How many of `new_tokens` [1, m] to keep: all, or up to and including the first EOS."""
    if eos_token_ids is None:
        return new_tokens.shape[1], False
    hits = torch.isin(new_tokens[0], eos_token_ids).nonzero()
    if hits.numel() == 0:
        return new_tokens.shape[1], False
    return int(hits[0, 0]) + 1, True


def decode(
    target: ModelRunner,
    drafter: Drafter | None,
    buffer: TokenBuffer,
    selector: TokenSelector,
    schedule: DraftSchedule | None,
    generator: torch.Generator | None,
    settings: LoopSettings,
    stats: GenerationStats,
) -> GenerationStats:
    """Generate into `buffer` until max_new_tokens or EOS; fill and return `stats`."""
    if buffer.ids.shape[0] != 1:
        raise NotImplementedError("the loop commits one row at a time; batch size must be 1")
    started = time.perf_counter()

    # Prefill: the target sees the prompt and picks the first token. The drafter sees the committed
    # tokens only when it is first asked to draft, so a schedule that never speculates never pays for it.
    logits = target.forward(buffer.committed(), last_only=True)
    first = _choose_first(logits, buffer.committed(), selector, generator)
    draft_ready = False
    buffer.ids[:, buffer.length] = first
    new_tokens, finished = _commit_count(buffer.ids[:, buffer.length : buffer.length + 1], settings.eos_token_ids)
    buffer.length += new_tokens
    settings.synchronize()
    prefill_done = time.perf_counter()

    while not finished and buffer.length - buffer.prompt_length < settings.max_new_tokens:
        remaining = settings.max_new_tokens - (buffer.length - buffer.prompt_length)
        gamma = schedule.draft_length() if (drafter is not None and schedule is not None) else 0
        if not settings.fixed_draft_length:
            gamma = min(gamma, remaining - 1)  # never draft what cannot be committed
        start = buffer.length

        if gamma > 0 and not draft_ready:
            drafter.prefill(buffer)
            draft_ready = True
        round_started = time.perf_counter()
        proposal = drafter.propose(buffer, gamma, selector, generator) if gamma > 0 else Proposal(0)
        if settings.fixed_draft_length and proposal.count != gamma:
            raise RuntimeError(f"{drafter.name} proposed {proposal.count} tokens; static shapes need exactly {gamma}")
        asked, gamma = gamma, proposal.count
        draft = buffer.ids[:, start : start + gamma]  # [B, γ]
        drafted_at = time.perf_counter()
        logits = target.forward(buffer.ids[:, target.length : start + gamma])  # [B, γ+1, V]
        context = buffer.through(start + gamma)
        if selector.do_sample:
            p = selector.probabilities(logits, context)  # [B, γ+1, V]
            if gamma > 0:
                accepted, next_token = speculative_accept(draft, proposal.q, p, generator)
            else:
                accepted, next_token = torch.zeros(1, dtype=torch.long), sample(p[:, -1], generator)
        else:
            accepted, next_token = greedy_accept(draft, selector.greedy(logits, context))

        n = int(accepted[0])  # the one host sync per round
        verified_at = time.perf_counter()
        buffer.ids[:, start + n] = next_token
        keep, finished = _commit_count(buffer.ids[:, start : start + min(n + 1, remaining)], settings.eos_token_ids)
        buffer.length = start + keep

        target.rollback(buffer.length - 1)  # the newest committed token stays pending
        if drafter is not None and asked > 0:
            drafter.rollback(buffer)
        stats.record_round(gamma, n)
        if schedule is not None:
            schedule.update(RoundObservation(gamma, n, drafted_at - round_started, verified_at - drafted_at))

    settings.synchronize()
    finished_at = time.perf_counter()
    stats.new_tokens = buffer.length - buffer.prompt_length
    stats.prefill_s = prefill_done - started
    stats.decode_s = finished_at - prefill_done
    stats.target_forwards = target.forward_count
    stats.draft_forwards = drafter.forward_count if drafter is not None else 0
    return stats

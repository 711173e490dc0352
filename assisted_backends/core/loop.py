"""The assisted-decoding loop: prefill -> [draft γ -> verify γ+1 -> accept -> commit/rollback]*.

With no drafter (or γ = 0) the same loop is plain autoregressive decoding, so both modes are
measured through one code path. Two optional hooks (`LoopSettings`): `stop` (stop strings and custom
criteria, `core.stopping`) flags the prefixes of a round where plain decoding would stop, on the
device; `on_commit` (streaming, `core.streaming`) receives each round's committed tokens. Both ride
the round's one host transfer.
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
from assisted_backends.core.stopping import StopCheck
from assisted_backends.core.tokens import TokenBuffer


@dataclass
class LoopSettings:
    max_new_tokens: int
    eos_token_ids: torch.Tensor | None  # [E] or None
    fixed_draft_length: bool  # static shapes: always draft γ, always verify γ + 1
    synchronize: Callable[[], None]
    stop: StopCheck | None = None  # stop strings / custom criteria, checked on every candidate prefix
    on_commit: Callable[[list[int]], None] | None = None  # receives the committed tokens of each round


def _choose_first(logits: torch.Tensor, context: torch.Tensor, selector: TokenSelector, generator) -> torch.Tensor:
    if selector.do_sample:
        return sample(selector.probabilities(logits, context), generator)[:, -1]
    return selector.greedy(logits, context)[:, -1]


def _round_outcome(
    accepted: torch.Tensor,
    span: torch.Tensor,
    eos_token_ids: torch.Tensor | None,
    stops: torch.Tensor | None,
    with_tokens: bool,
) -> tuple[int, int, list[int]]:
    """(n, e, tokens): the accepted count, the index in `span` [1, m] of the first EOS or stop among the
    n + 1 new tokens (m when there is none) and, when asked, the span's tokens, read from the device in
    one transfer: the round's only host sync. `stops` [m]: where a stopping criterion fires."""
    if eos_token_ids is None and stops is None and not with_tokens:
        return int(accepted[0]), span.shape[1], []
    positions = torch.arange(span.shape[1], device=span.device)
    hits = positions > span.shape[1]  # [m] all False
    if eos_token_ids is not None:
        hits = hits | torch.isin(span[0], eos_token_ids)
    if stops is not None:
        hits = hits | stops
    hits = hits & (positions <= accepted[0])  # [m]
    first = torch.where(hits.any(), hits.long().argmax(), span.shape[1])
    parts = [torch.stack([accepted[0], first])] + ([span[0]] if with_tokens else [])
    values = torch.cat(parts).tolist()
    return values[0], values[1], values[2:]


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
    finished = settings.eos_token_ids is not None and bool(torch.isin(first, settings.eos_token_ids).any())
    if settings.stop is not None and not finished:
        finished = bool(settings.stop.hits(buffer.ids, buffer.length, 1, logits[:, -1:])[0])
    buffer.length += 1
    if settings.on_commit is not None:
        settings.on_commit(first.tolist())
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
                accepted, next_token = torch.zeros(1, dtype=torch.long, device=p.device), sample(p[:, -1], generator)
        else:
            accepted, next_token = greedy_accept(draft, selector.greedy(logits, context))

        span = buffer.ids[:, start : start + gamma + 1]  # [1, γ+1]: the draft, then scratch
        span.scatter_(1, accepted[:, None], next_token[:, None])  # the target's token after the n accepted
        stops = settings.stop.hits(buffer.ids, start, gamma + 1, logits) if settings.stop is not None else None
        n, first_eos, tokens = _round_outcome(
            accepted, span, settings.eos_token_ids, stops, settings.on_commit is not None
        )
        verified_at = time.perf_counter()
        keep = min(n + 1, remaining, first_eos + 1)  # up to the token limit and the first EOS/stop included
        finished = first_eos < keep
        buffer.length = start + keep
        if settings.on_commit is not None:
            settings.on_commit(tokens[:keep])  # committed tokens only: never a rejected draft token

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

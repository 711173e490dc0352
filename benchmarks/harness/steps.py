"""Step timing: one model forward of M new tokens on a KV cache of L positions, cut back to L after each call.

A target decode step is M = 1, a verify pass M = γ + 1, a draft step M = 1 through the draft. The cache is
filled once (untimed) with the context; each timed call feeds M tokens and crops the cache back, so every
repeat sees the same length.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from assisted_backends import hf_compat
from benchmarks.harness.timing import interleaved


def random_context(vocab: int, length: int, seed: int | None = None) -> torch.Tensor:
    """[1, length] random token ids below `vocab` (from torch's global generator when `seed` is None)."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return torch.randint(0, vocab, (1, length), generator=generator)


def forward_step(
    model: torch.nn.Module, context: torch.Tensor, tokens: int = 1, fed: torch.Tensor | None = None
) -> Callable[[], None]:
    """A callable running one forward of `tokens` tokens (`fed`, default the context's last ones) on a cache
    holding `context` ([1, L], moved to the model's device); the cache is cropped back to L after it."""
    device = next(model.parameters()).device
    context = context.to(device)
    fed = (context[:, -tokens:] if fed is None else fed).to(device)  # [1, M]
    length = context.shape[1]
    cache = hf_compat.new_dynamic_cache(model)
    with torch.inference_mode():  # the prompt pass (untimed): only the last position's logits
        model(
            input_ids=context,
            use_cache=True,
            **hf_compat.cache_kwargs(model, cache),
            **hf_compat.logits_to_keep_kwargs(model, 1),
        )

    def step() -> None:
        with torch.inference_mode():
            model(input_ids=fed, use_cache=True, **hf_compat.cache_kwargs(model, cache))
        hf_compat.crop_dynamic_cache(cache, length)

    return step


def step_seconds(
    model: torch.nn.Module,
    context: torch.Tensor,
    tokens: int = 1,
    repeats: int = 15,
    warmup: int = 0,
    synchronize: Callable[[], None] | None = None,
) -> float:
    """Median seconds of `forward_step(model, context, tokens)` over `repeats` calls after `warmup` ones."""
    timings = interleaved({"step": forward_step(model, context, tokens)}, repeats, warmup, synchronize=synchronize)
    return timings.median("step")


def decode_step(model: torch.nn.Module, context: torch.Tensor, **timing) -> float:
    """Median seconds of one decode step (one token) after `context`: a target step, or a draft step."""
    return step_seconds(model, context, 1, **timing)


def verify_step(model: torch.nn.Module, context: torch.Tensor, gamma: int, **timing) -> float:
    """Median seconds of one verify pass (γ + 1 tokens) after `context`."""
    return step_seconds(model, context, gamma + 1, **timing)


def cost_ratio(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    context: torch.Tensor,
    draft_context: torch.Tensor | None = None,
    **timing,
) -> tuple[float, float, float]:
    """(c, t_target, t_draft): c = one draft decode step / one target decode step, both after the prompt
    (`draft_context` when the draft has its own tokenizer)."""
    t_target = decode_step(target, context, **timing)
    t_draft = decode_step(draft, context if draft_context is None else draft_context, **timing)
    return t_draft / t_target, t_target, t_draft

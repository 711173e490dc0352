"""Training the demo target and draft together on the same batches.

Muon (orthogonalised momentum) for the hidden 2-D weight matrices and AdamW for embeddings and
norms trained fastest here; torch without `torch.optim.Muon` (< 2.9) falls back to AdamW alone.
bf16 autocast uses AMX where the CPU has it. A fixed seed, step count and thread count make the
weights reproducible on the same torch build.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int

    def config(self, vocab_size: int, eos_token_id: int, pad_token_id: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden,
            intermediate_size=int(self.hidden * 8 / 3) // 64 * 64 or 64,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.heads,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            bos_token_id=eos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            attn_implementation="sdpa",
        )


def _optimizers(model: torch.nn.Module, steps: int) -> list[torch.optim.Optimizer]:
    hidden = [p for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n and "lm_head" not in n]
    other = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "embed" not in n and "lm_head" not in n)]
    if hasattr(torch.optim, "Muon"):
        return [
            torch.optim.Muon(hidden, lr=0.02, momentum=0.95, weight_decay=0.0, adjust_lr_fn="match_rms_adamw"),
            torch.optim.AdamW(other, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0),
        ]
    return [torch.optim.AdamW(hidden + other, lr=2e-3, betas=(0.9, 0.95), weight_decay=0.0)]


def _lr_scale(step: int, steps: int) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10%."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def train_models(
    models: list[LlamaForCausalLM],
    tokens: torch.Tensor,
    steps: int,
    batch_size: int,
    sequence_length: int,
    seed: int,
    on_step: Callable[[int, list[float]], None] = lambda step, losses: None,
) -> list[float]:
    """Train every model in `models` on the same random windows of `tokens` [N]; return final losses."""
    generator = torch.Generator().manual_seed(seed)
    optimizers = [_optimizers(model, steps) for model in models]
    bases = [[group["lr"] for opt in opts for group in opt.param_groups] for opts in optimizers]
    losses = [float("nan")] * len(models)
    for model in models:
        model.train()
    for step in range(steps):
        starts = torch.randint(0, tokens.numel() - sequence_length - 1, (batch_size,), generator=generator)
        window = torch.stack([tokens[s : s + sequence_length + 1] for s in starts.tolist()])  # [B, T+1]
        for index, (model, opts) in enumerate(zip(models, optimizers)):
            scale = _lr_scale(step, steps)
            groups = [group for opt in opts for group in opt.param_groups]
            for group, base in zip(groups, bases[index]):
                group["lr"] = base * scale
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(input_ids=window[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            for opt in opts:
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses[index] = float(loss.detach())
        on_step(step, losses)
    for model in models:
        model.eval()
    return losses

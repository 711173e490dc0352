"""Training the demo target and draft together on the same batches.

AdamW with warm-up and cosine decay; bf16 autocast (AMX or AVX512-BF16 where the CPU has them).
A fixed seed, step count and thread count make the weights reproducible on the same torch build.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

EARLY_EXIT_WEIGHT = 0.3


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


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW. (Muon's Newton-Schulz iterations cost more than the model's own step at these batch sizes on CPU.)"""
    return torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)


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
    early_exit_layer: int = 0,
) -> list[float]:
    """Train every model in `models` on the same random windows of `tokens` [N]; return final losses.

    `early_exit_layer` k > 0 adds a LayerSkip-style loss on the output of layer k through the final
    norm and head (for models deeper than k), so the first k layers make a usable self-speculative draft.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizers = [_optimizer(model) for model in models]
    bases = [optimizer.param_groups[0]["lr"] for optimizer in optimizers]
    losses = [float("nan")] * len(models)
    for model in models:
        model.train()
    for step in range(steps):
        starts = torch.randint(0, tokens.numel() - sequence_length - 1, (batch_size,), generator=generator)
        window = torch.stack([tokens[s : s + sequence_length + 1] for s in starts.tolist()])  # [B, T+1]
        for index, (model, optimizer) in enumerate(zip(models, optimizers)):
            for group in optimizer.param_groups:
                group["lr"] = bases[index] * _lr_scale(step, steps)
            labels = window[:, 1:].flatten()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                output = model(input_ids=window[:, :-1], output_hidden_states=bool(early_exit_layer))
                loss = torch.nn.functional.cross_entropy(output.logits.float().flatten(0, 1), labels)
                if early_exit_layer and model.config.num_hidden_layers > early_exit_layer:
                    exit_logits = model.lm_head(model.model.norm(output.hidden_states[early_exit_layer]))
                    exit_loss = torch.nn.functional.cross_entropy(exit_logits.float().flatten(0, 1), labels)
                    loss = loss + EARLY_EXIT_WEIGHT * exit_loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[index] = float(loss.detach())
        on_step(step, losses)
    for model in models:
        model.eval()
    return losses

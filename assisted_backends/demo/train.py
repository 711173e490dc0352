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
) -> list[float]:
    """Train every model in `models` on the same random windows of `tokens` [N]; return final losses."""
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
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(input_ids=window[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[index] = float(loss.detach())
        on_step(step, losses)
    for model in models:
        model.eval()
    return losses


def distill(
    student: LlamaForCausalLM,
    teacher: LlamaForCausalLM,
    tokens: torch.Tensor,
    steps: int,
    batch_size: int,
    sequence_length: int,
    seed: int,
    on_step: Callable[[int, float], None] = lambda step, loss: None,
) -> float:
    """Fit the draft q to the target p: minimise KL(p ‖ q) on random windows of `tokens` (teacher forcing).

    Acceptance is the overlap of the two distributions (α = Σ min(p, q) when sampling; agreement of
    the argmaxes when greedy), so matching the target beats matching the data for a draft.
    """
    generator = torch.Generator().manual_seed(seed + 1)
    optimizer = _optimizer(student)
    base = optimizer.param_groups[0]["lr"]
    student.train()
    teacher.eval()
    loss_value = float("nan")
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = base * _lr_scale(step, steps)
        starts = torch.randint(0, tokens.numel() - sequence_length, (batch_size,), generator=generator)
        window = torch.stack([tokens[s : s + sequence_length] for s in starts.tolist()])  # [B, T]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.inference_mode():
                target_log_p = torch.log_softmax(teacher(input_ids=window).logits.float(), dim=-1)
            log_q = torch.log_softmax(student(input_ids=window).logits.float(), dim=-1)
        target_log_p = target_log_p.clone()  # leave inference mode's tensor behind for autograd
        loss = torch.nn.functional.kl_div(log_q, target_log_p, log_target=True, reduction="batchmean") / sequence_length
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = float(loss.detach())
        on_step(step, loss_value)
    student.eval()
    return loss_value

"""The byte-level pair trained here: a 4 x 256 Llama target and a 1 x 128 draft on the standard library's source.

Vocabulary 256 (bytes: no tokenizer to train); both models train on the same batches for a fixed number
of steps, so the draft agrees with the target often but not always (a real acceptance rate, not a copy's).
Trained once (a minute or two on 2 cores), then loaded from `$ASSISTED_BACKENDS_CACHE`
(default ~/.cache/assisted_backends).
"""

from __future__ import annotations

import sysconfig
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from assisted_backends.cache_dir import cache_root
from benchmarks.harness.models import random_llama

PAIR_STEPS = 300
PAIR_SEQ = 128
PAIR_BATCH = 8


def corpus(max_bytes: int = 4_000_000) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes of the standard library's .py files (tests and site-packages left out): (train, held-out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    data = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()
    split = int(0.95 * len(data))
    return data[:split], data[split:]


def _train(model: LlamaForCausalLM, train: torch.Tensor, steps: int, seed: int) -> None:
    """AdamW, warm-up then linear decay, bf16 autocast, random windows of `train`."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    for step in range(steps):
        lr_scale = min(1.0, (step + 1) / 30) * (0.1 + 0.9 * (1 - step / steps))
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * lr_scale
        starts = torch.randint(0, len(train) - PAIR_SEQ - 1, (PAIR_BATCH,), generator=generator)
        batch = torch.stack([train[s : s + PAIR_SEQ] for s in starts.tolist()])  # [B, T]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss  # transformers shifts the labels itself
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % 100 == 0:
            print(f"  step {step + 1}/{steps}: loss {loss.item():.3f}", flush=True)
    model.eval()


def trained_pair(steps: int = PAIR_STEPS) -> tuple[LlamaForCausalLM, LlamaForCausalLM, torch.Tensor]:
    """(target, draft, held-out bytes): trained once, then loaded from the cache."""
    cache = cache_root()
    directory = cache / f"xeon_bench_pair_v2_{steps}x{PAIR_BATCH}"
    train, held_out = corpus()
    if (directory / "target" / "config.json").exists() and (directory / "draft" / "config.json").exists():
        target = LlamaForCausalLM.from_pretrained(directory / "target").eval()
        draft = LlamaForCausalLM.from_pretrained(directory / "draft").eval()
        return target, draft, held_out
    target = random_llama(hidden=256, layers=4, vocab=256, heads=4, seed=0)
    draft = random_llama(hidden=128, layers=1, vocab=256, heads=2, seed=1)
    started = time.perf_counter()
    _train(target, train, steps, seed=0)
    _train(draft, train, steps, seed=0)
    print(f"trained the pair in {time.perf_counter() - started:.0f} s; cached in {directory}", flush=True)
    target.save_pretrained(directory / "target")
    draft.save_pretrained(directory / "draft")
    return target, draft, held_out

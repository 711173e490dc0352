"""Examples -> right-padded training batches (`ttt.Batch`) over a chosen draft vocabulary."""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from assisted_backends.train_draft.data import Example
from assisted_backends.train_draft.ttt import Batch
from assisted_backends.train_draft.vocab import draft_ids


def collate(examples: list[Example], lookup: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Batch:
    """Pad `examples` on the right; `lookup` [V]: target id -> draft id (−1: none)."""
    longest = max(e.tokens.shape[0] for e in examples)
    count, width, k = len(examples), examples[0].features.shape[1], examples[0].top_ids.shape[1]
    tokens = torch.zeros(count, longest, dtype=torch.long)
    features = torch.zeros(count, longest, width, dtype=dtype)
    labels = torch.full((count, longest, k), -1, dtype=torch.long)
    probs = torch.zeros(count, longest, k, dtype=torch.float32)
    for row, e in enumerate(examples):
        length = e.tokens.shape[0]
        tokens[row, :length] = e.tokens.long()
        features[row, :length] = e.features.to(dtype)
        labels[row, :length] = lookup[e.top_ids.long()]
        probs[row, :length] = e.top_probs.float()
    return Batch(
        tokens=tokens.to(device),
        features=features.to(device),
        labels=labels.to(device),
        probs=probs.to(device),
        choice=labels[..., 0].to(device),
        lengths=torch.tensor([e.tokens.shape[0] for e in examples], device=device),
        starts=torch.tensor([e.start for e in examples], device=device),
    )


def token_counts(examples: list[Example], vocab_size: int) -> torch.Tensor:
    """[V] how often the target chose each token (its argmax) over every position of `examples`."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for e in examples:
        counts += torch.bincount(e.top_ids[:, 0].long(), minlength=vocab_size)[:vocab_size]
    return counts


def epochs(examples: list[Example], batch_size: int, seed: int) -> Iterator[list[Example]]:
    """Batches of similar-length examples, reshuffled every epoch, forever."""
    rng = random.Random(seed)
    while True:
        order = sorted(range(len(examples)), key=lambda i: (examples[i].tokens.shape[0], rng.random()))
        chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            yield [examples[i] for i in chunk]


def vocabulary_lookup(t2d: torch.Tensor) -> torch.Tensor:
    return draft_ids(t2d)

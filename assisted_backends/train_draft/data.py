"""Training data for a head: the target's own greedy continuations, its features and its next-token choices.

For a batch of prompts the target continues each one greedily, up to `new_tokens` or its EOS, and every
forward of that decoding (the prompt pass, then one step per token) keeps, per position t, the features f_t
[3 H_t] (`drafters.eagle.features.LayerTap`) and the top-k of the target's next-token distribution p_t
(probabilities over the full vocabulary; the prompt's logits are computed one row at a time): the features of a
continuation cost nothing beyond generating it (`generate_examples`). `featurize` computes the same for given
sequences with one right-padded forward (causal attention keeps the padding out of the real positions).
Examples are kept as plain tensors (bf16 features, int32 ids, fp16 probabilities) and saved as shards that
`torch.load(weights_only=True)` reads back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from assisted_backends import hf_compat
from assisted_backends.drafters.eagle.features import LayerTap
from assisted_backends.engine.head_on_demand import OnDemandHead

FEATURE_DTYPE = torch.bfloat16


@dataclass
class Example:
    """One sequence: tokens [T], the first generated position `start`, features [T, 3 H_t], and the target's
    top-k next-token ids [T, k] (int32) and probabilities [T, k] (fp16) at every position."""

    tokens: torch.Tensor
    start: int
    features: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor

    def as_dict(self) -> dict:
        return dict(tokens=self.tokens, start=self.start, features=self.features, top_ids=self.top_ids,
                    top_probs=self.top_probs)  # fmt: skip


def continue_greedily(target, prompts: list[list[int]], new_tokens: int, pad_id: int) -> list[list[int]]:
    """The target's greedy continuation of each prompt (up to `new_tokens`, EOS included), in one batch."""
    from assisted_backends import generate

    longest = max(len(p) for p in prompts)
    device = hf_compat.model_device(target)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    result = generate(
        target, ids.to(device), attention_mask=mask.to(device), max_new_tokens=new_tokens, do_sample=False,
        pad_token_id=pad_id,
    )  # fmt: skip
    return [result.sequences[row, longest : longest + stats.new_tokens].tolist() for row, stats in
            enumerate(result.stats.rows)]  # fmt: skip


@torch.inference_mode()
def featurize(target, tap: LayerTap, sequences: list[list[int]], starts: list[int], top_k: int) -> list[Example]:
    """One right-padded forward over `sequences`: the features and top-k next-token choices of every position."""
    head = OnDemandHead.of(target)
    device = hf_compat.model_device(target)
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
    with tap.capture() as captured, head.capture(skip=True):
        target(input_ids=ids.to(device), use_cache=False)
    features = tap.features(captured)  # [B, T, 3 H_t]
    examples = []
    for row, sequence in enumerate(sequences):
        length = len(sequence)
        probs = torch.softmax(head.logits(head.captured[row : row + 1, :length]), dim=-1)[0]  # [T, V]
        top = probs.topk(top_k, dim=-1)
        examples.append(
            Example(
                tokens=ids[row, :length].to(torch.int32),
                start=starts[row],
                features=features[row, :length].to(FEATURE_DTYPE).cpu(),
                top_ids=top.indices.to(torch.int32).cpu(),
                top_probs=top.values.to(torch.float16).cpu(),
            )
        )
    return examples


def make_examples(
    target, tap: LayerTap, prompts: list[list[int]], new_tokens: int, pad_id: int, top_k: int
) -> list[Example]:
    """Continue `prompts` greedily and keep what training needs from every prompt + continuation."""
    continuations = continue_greedily(target, prompts, new_tokens, pad_id)
    sequences = [p + c for p, c in zip(prompts, continuations)]
    return featurize(target, tap, sequences, [len(p) for p in prompts], top_k)


@torch.inference_mode()
def generate_examples(
    target,
    tap: LayerTap,
    prompts: list[list[int]],
    new_tokens: int,
    pad_id: int,
    eos_ids: list[int],
    top_k: int,
    deadline: float | None = None,
) -> list[Example]:
    """Greedy batched decoding of `prompts` (left-padded) that keeps the features and top-k choices of every fed
    position. A row's sequence is its prompt and its continuation up to its EOS or `new_tokens` tokens, every
    token of it fed except the last (whose features no training pair reads). `deadline` (a `time.perf_counter()`
    value): decoding stops there, the continuations cut short; rows with no continuation are dropped."""
    head = OnDemandHead.of(target)
    device = hf_compat.model_device(target)
    batch, longest = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((batch, longest), pad_id, dtype=torch.long)
    mask = torch.zeros(batch, longest, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = hf_compat.new_dynamic_cache(target)
    with_cache = hf_compat.cache_kwargs(target, cache)
    with tap.capture() as captured, head.capture(skip=True):
        target(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **with_cache)
    features = [tap.features(captured).to(FEATURE_DTYPE).cpu()]  # [B, P, 3 H_t] per forward
    hidden = head.captured  # [B, P, D]
    top_ids, top_probs, last = [], [], []
    for row in range(batch):
        probs = torch.softmax(head.logits(hidden[row : row + 1]), dim=-1)[0]  # [P, V]
        top = probs.topk(top_k, dim=-1)
        top_ids.append([top.indices.to(torch.int32).cpu()])
        top_probs.append([top.values.to(torch.float16).cpu()])
        last.append(int(top.indices[-1, 0]))
    tokens = [[] for _ in range(batch)]  # the continuation of each row
    done = [False] * batch
    next_token = torch.tensor(last, device=device)[:, None]  # [B, 1]
    position = positions[:, -1:]
    eos = set(eos_ids)
    for _ in range(new_tokens):
        if all(done) or (deadline is not None and time.perf_counter() >= deadline and any(tokens)):
            break
        for row in range(batch):
            if not done[row]:
                tokens[row].append(int(next_token[row, 0]))
                done[row] = tokens[row][-1] in eos or len(tokens[row]) == new_tokens
        mask = torch.cat([mask, torch.ones_like(next_token)], dim=1)
        position = position + 1
        with tap.capture() as captured:  # fed even when it is a row's last token: its choices label that position
            logits = target(input_ids=next_token, attention_mask=mask, position_ids=position, use_cache=True,
                            **with_cache).logits[:, -1].float()  # fmt: skip
        features.append(tap.features(captured).to(FEATURE_DTYPE).cpu())
        top = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
        for row in range(batch):
            top_ids[row].append(top.indices[row : row + 1].to(torch.int32).cpu())
            top_probs[row].append(top.values[row : row + 1].to(torch.float16).cpu())
        next_token = top.indices[:, :1]
    fed = torch.cat(features, dim=1)  # [B, P + steps, 3 H_t]
    examples = []
    for row, prompt in enumerate(prompts):
        if not tokens[row]:
            continue
        length = len(prompt) + len(tokens[row])
        begin = longest - len(prompt)
        examples.append(
            Example(
                tokens=torch.tensor(prompt + tokens[row], dtype=torch.int32),
                start=len(prompt),
                features=fed[row, begin : begin + length],
                top_ids=_row_tops(top_ids[row], begin, length),
                top_probs=_row_tops(top_probs[row], begin, length),
            )
        )
    return examples


def _row_tops(parts: list[torch.Tensor], begin: int, count: int) -> torch.Tensor:
    """One row's top-k over its real positions: the prompt pass's (from column `begin`), then one per step."""
    return torch.cat([parts[0][begin:], *parts[1:]], dim=0)[:count]


def save_shard(examples: list[Example], path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save([e.as_dict() for e in examples], partial)
    partial.rename(path)


def load_shard(path: Path) -> list[Example]:
    return [Example(**item) for item in torch.load(path, weights_only=True)]

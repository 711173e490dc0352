"""Training data for a head: the target's own greedy continuations, its features and its next-token choices.

For a batch of prompts the target continues each one greedily (plain batched decoding through this
package's `generate`), up to `new_tokens` or its EOS. Then one forward over every prompt + continuation
(right-padded: causal attention keeps the padding out of the real positions) keeps, per position t, the
features f_t [3 H_t] (`drafters.eagle.features.LayerTap`) and the top-k of the target's next-token
distribution p_t (probabilities over the full vocabulary; the head's logits are computed one row at a time).
Examples are kept as plain tensors (bf16 features, int32 ids, fp16 probabilities) and saved as shards that
`torch.load(weights_only=True)` reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

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
    device = target.get_input_embeddings().weight.device
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
    device = target.get_input_embeddings().weight.device
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


def save_shard(examples: list[Example], path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save([e.as_dict() for e in examples], partial)
    partial.rename(path)


def load_shard(path: Path) -> list[Example]:
    return [Example(**item) for item in torch.load(path, weights_only=True)]

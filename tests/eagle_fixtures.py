"""EAGLE-3 heads for tiny random targets: random ones, and ones trained for a second so that drafts get accepted
(the acceptance, rollback and realignment paths only run when some draft tokens are accepted)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from assisted_backends import hf_compat
from assisted_backends.drafters.eagle.config import default_feature_layers
from assisted_backends.drafters.eagle.features import LayerTap
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.train_draft import batches, ttt
from assisted_backends.train_draft.data import featurize
from assisted_backends.train_draft.head_init import new_head
from assisted_backends.train_draft.vocab import choose_vocabulary


def target_vocab(target) -> int:
    return int(target.get_output_embeddings().weight.shape[0])


def random_head(target, draft_vocab: int = 48, seed: int = 0) -> Eagle3Head:
    """An untrained head over `draft_vocab` tokens spread over the target's vocabulary (d2t not the identity)."""
    vocab = target_vocab(target)
    kept = torch.linspace(0, vocab - 1, draft_vocab).round().long().unique()
    counts = torch.zeros(vocab, dtype=torch.long)
    counts[kept] = 1
    d2t, t2d = choose_vocabulary(counts, kept.numel())
    depth = hf_compat.text_config(target).num_hidden_layers
    return new_head(target, d2t, t2d, default_feature_layers(depth), seed).eval()


def trained_head(target, steps: int = 60, draft_vocab: int = 96, seed: int = 0, sequences: int = 24) -> Eagle3Head:
    """A head trained for `steps` TTT steps on the target's greedy continuations of random prompts."""
    vocab = target_vocab(target)
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (sequences, 6), generator=generator)
    with torch.inference_mode():
        full = target.generate(prompts, max_new_tokens=26, min_new_tokens=26, do_sample=False,
                               pad_token_id=0, eos_token_id=None)  # fmt: skip
    return _trained(target, full.tolist(), 6, steps, draft_vocab, seed)


def _trained(target, sequences: list[list[int]], start: int, steps: int, draft_vocab: int, seed: int) -> Eagle3Head:
    vocab = target_vocab(target)
    depth = hf_compat.text_config(target).num_hidden_layers
    layers = default_feature_layers(depth)
    examples = featurize(target, LayerTap(target, layers), sequences, [start] * len(sequences), top_k=4)
    d2t, t2d = choose_vocabulary(batches.token_counts(examples, vocab), draft_vocab)
    head = new_head(target, d2t, t2d, layers, seed)
    head.use_target_embedding(target.get_input_embeddings().weight.detach())
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    lookup = batches.vocabulary_lookup(head.t2d)
    sampler = batches.epochs(examples, 8, seed)
    for _ in range(steps):
        batch = batches.collate(next(sampler), lookup, torch.device("cpu"), torch.float32)
        loss = ttt.unroll(head, batch, 3).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    head.use_target_embedding(None)
    return head.eval()


DEMO_DIR = Path(__file__).resolve().parents[1] / "assisted_backends" / "demo" / "weights"


@cache
def demo_target():
    """The embedded demo target (6 layers x 384, trained on the standard library) in fp32, and its tokenizer:
    a real, if small, model whose continuations a head learns to predict within seconds."""
    from assisted_backends.loading.models import load_model, load_tokenizer

    return load_model(DEMO_DIR / "target", precision="fp32"), load_tokenizer(DEMO_DIR / "target")


def demo_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    """Token windows of the demo pair's held-out text."""
    _, tokenizer = demo_target()
    ids = tokenizer((DEMO_DIR / "held_out.txt").read_text()[:60000])["input_ids"]
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - length, (count,), generator=generator).tolist()
    return [ids[s : s + length] for s in starts]


@cache
def demo_head(steps: int = 40) -> Eagle3Head:
    """A head for the demo target, trained for `steps` steps on its continuations of held-out windows."""
    target, _ = demo_target()
    prompts = torch.tensor(demo_prompts(48, 24, seed=0))
    with torch.inference_mode():
        full = target.generate(prompts, max_new_tokens=24, min_new_tokens=24, do_sample=False, eos_token_id=None,
                               pad_token_id=1)  # fmt: skip
    return _trained(target, full.tolist(), 24, steps, draft_vocab=512, seed=0)

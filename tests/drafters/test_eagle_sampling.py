"""Lossless sampling with an EAGLE-3 head: q is exactly the distribution the drafted token was drawn from, the
head's softmax carried onto the target's vocabulary through d2t (zero outside the mapped ids) after the call's
logits processors; seeded sampling is reproducible and the static-shape census stays bounded."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from eagle_fixtures import demo_head, demo_prompts, demo_target
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

from assisted_backends import generate
from assisted_backends.drafters.eagle.build import build_eagle_drafter
from assisted_backends.engine.kv_cache import make_layout
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import SamplingConfig, TokenSelector
from assisted_backends.engine.slots import Slots

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompt(seed: int, length: int = 30) -> torch.Tensor:
    return torch.tensor(demo_prompts(1, length, seed=seed))


@pytest.mark.parametrize(
    "warpers", [[], [TemperatureLogitsWarper(0.7), TopKLogitsWarper(20)]], ids=["plain", "T0.7-top20"]
)
def test_q_is_the_heads_distribution_on_the_target_vocabulary(warpers):
    target, _ = demo_target()
    head = demo_head()
    vocab = target.get_output_embeddings().weight.shape[0]
    prompt = _prompt(51)
    slots = Slots(torch.cat([prompt, torch.tensor([[7]])], dim=1), 64, 1)  # the prompt, then its first token (7)
    runner = ModelRunner(target, make_layout("dynamic", target, torch.zeros(1, dtype=torch.long), 64, 16))
    drafter = build_eagle_drafter(head, runner, static_shapes=False, vocab_size=vocab)
    runner.forward(slots.ids[:, : slots.length - 1], last_only=True)  # the first token pending
    drafter.prefill(slots)
    selector = TokenSelector(SamplingConfig(do_sample=True), warpers)
    generator = torch.Generator().manual_seed(0)
    start = slots.length
    state = drafter.cache.length, drafter.exact, drafter._last
    proposal = drafter.propose(slots, 3, selector, generator)
    drafted = slots.ids[0, start : start + 3]
    assert proposal.count == 3 and proposal.q.shape == (1, 3, vocab)

    # Recompute each q_i independently: the head's logits over V_d, softmax, carried through d2t, processors applied.
    drafter.cache.length, drafter.exact, drafter._last = state
    mapped = head.target_ids(torch.arange(head.config.draft_vocab_size))
    hidden = drafter._last
    for i in range(3):
        logits = head.draft_logits(hidden)[0, 0].float()  # [V_d]
        scores = torch.full((1, vocab), float("-inf"))
        scores[0, mapped] = logits
        for warper in warpers:
            scores = warper(None, scores)
        expected = torch.softmax(scores, dim=-1)[0]
        torch.testing.assert_close(proposal.q[0, i], expected, rtol=1e-6, atol=1e-7)
        outside = torch.ones(vocab, dtype=torch.bool)
        outside[mapped] = False
        assert float(proposal.q[0, i][outside].abs().max()) == 0.0  # zero outside the mapped ids
        assert proposal.q[0, i, drafted[i]] > 0  # the drawn token has q > 0
        if i < 2:
            with torch.inference_mode():
                hidden = drafter._run(slots, start - 1 + i, 1, hidden)
            drafter.cache.length = start + i


def test_seeded_sampling_is_reproducible_and_uses_the_head():
    target, _ = demo_target()
    prompt = _prompt(52)
    runs = [
        generate(
            target,
            prompt,
            assistant_model=demo_head(),
            max_new_tokens=30,
            do_sample=True,
            temperature=0.8,
            num_assistant_tokens=3,
            seed=5,
        )  # fmt: skip
        for _ in range(2)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.drafter == "eagle3" and runs[0].stats.drafted > 0 and runs[0].stats.accepted > 0


def test_static_shape_census_is_bounded():
    """Static shapes: the head sees one prompt signature per prompt bucket, the (γ + 1)-column catch-up and the
    one-column chain step; the target one prefill per bucket and one verify signature."""
    target, _ = demo_target()
    head = demo_head()
    shapes: dict[str, set] = defaultdict(set)
    hooks = [
        head.register_forward_pre_hook(lambda _m, args: shapes["head"].add(tuple(args[0].shape))),
        target.register_forward_pre_hook(
            lambda _m, args, kwargs: shapes["target"].add(tuple(kwargs["input_ids"].shape)), with_kwargs=True
        ),
    ]
    gamma, bucket = 3, 16
    try:
        for length, new in ((5, 20), (11, 33), (20, 9), (29, 40)):
            prompt = _prompt(60 + length, length)
            result = generate(
                target, prompt, assistant_model=head, max_new_tokens=new, num_assistant_tokens=gamma,
                static_shapes=True, bucket_size=bucket,
            )  # fmt: skip
            assert result.stats.accepted >= 0
    finally:
        for hook in hooks:
            hook.remove()
    prompt_buckets = {16, 32}
    assert shapes["head"] <= {(1, p) for p in prompt_buckets} | {(1, gamma + 1), (1, 1)}
    assert shapes["target"] <= {(1, p) for p in prompt_buckets} | {(1, gamma + 1)}

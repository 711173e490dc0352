"""Sampling with a draft of another vocabulary is lossless (Timor et al., ICML 2025: token-level intersection).

Same method as tests/engine/test_lossless_sampling.py, whose exact enumeration it reuses: a 6-token target
vocabulary (a Unigram tokenizer built here), a draft with another 8-token vocabulary sharing 4 of
them, every 4-token continuation scored by the target for the exact reference. Five chi-square
statistics at 2e-4 each: false-alarm rate at most 1e-3 (Bonferroni). Power check: the same
counts must reject the target's distribution at temperature 1.5 instead of 1.0.
"""

import pytest
import torch
from any_draft_fixtures import SMALL_DRAFT_PIECES, SMALL_TARGET_PIECES, handmade_unigram
from stats_tools import NEW, PROMPT, V, assert_same_distribution, exact_joint, sample_counts
from tiny_models import tiny_model
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper

from assisted_backends import generate
from assisted_backends.drafters.any_pair.token_bytes import ByteCodec
from assisted_backends.drafters.any_pair.vocab_mapping import VocabIntersection

SAMPLES = 2500


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_tokenizers")
    return handmade_unigram(SMALL_TARGET_PIECES, root / "target"), handmade_unigram(SMALL_DRAFT_PIECES, root / "draft")


def test_intersection_maps_shared_tokens_both_ways(tokenizers):
    target_tokenizer, draft_tokenizer = tokenizers
    shared = VocabIntersection(ByteCodec(draft_tokenizer), ByteCodec(target_tokenizer), 8, V)
    pairs = {
        draft_tokenizer.convert_ids_to_tokens(d): target_tokenizer.convert_ids_to_tokens(t)
        for d, t in zip(shared.draft_ids.tolist(), shared.target_ids.tolist())
    }
    assert pairs == {"a": "a", "b": "b", "c": "c", "▁": "▁"}
    q = torch.softmax(torch.randn(3, 8, dtype=torch.float64), dim=-1)
    restricted, mass = shared.restrict(q)
    assert torch.allclose(mass, q[:, shared.draft_ids].sum(-1))
    q_target = shared.to_target(restricted)
    assert torch.allclose(q_target.sum(-1), torch.ones(3, dtype=torch.float64))
    outside = torch.ones(V, dtype=torch.bool)
    outside[shared.target_ids] = False
    assert bool((q_target[:, outside] == 0).all()), "q must be zero outside the intersection"
    for d, t in zip(shared.draft_ids.tolist(), shared.target_ids.tolist()):
        assert torch.allclose(q_target[:, t], restricted[:, d])


def test_disjoint_vocabularies_cannot_sample(tokenizers, tmp_path):
    target_tokenizer, _ = tokenizers
    other = handmade_unigram(["<unk>", "x", "y", "z"], tmp_path / "other")
    with pytest.raises(ValueError, match="share no token"):
        VocabIntersection(ByteCodec(other), ByteCodec(target_tokenizer), 4, V)


@pytest.mark.slow
def test_sampling_with_another_vocabulary_matches_plain_sampling(tokenizers):
    target_tokenizer, draft_tokenizer = tokenizers
    target = tiny_model("llama", seed=0, vocab=V, init=0.15)
    draft = tiny_model("gpt2", seed=1, vocab=len(SMALL_DRAFT_PIECES), init=0.15, hidden=32, layers=1)

    def draw(seed: int):
        result = generate(
            target,
            PROMPT,
            assistant_model=draft,
            tokenizer=target_tokenizer,
            assistant_tokenizer=draft_tokenizer,
            max_new_tokens=NEW,
            do_sample=True,
            num_assistant_tokens=3,
            seed=seed,
        )
        assert result.stats.drafter == "draft_model_translated"
        return result

    counts, acceptance = sample_counts(draw, SAMPLES)
    assert 0.1 < acceptance < 0.9, "the pair must both accept and reject for this test to mean anything"
    assert_same_distribution(
        counts,
        exact_joint(target, LogitsProcessorList([TemperatureLogitsWarper(1.0)])),
        other=exact_joint(target, LogitsProcessorList([TemperatureLogitsWarper(1.5)])),
    )

"""Greedy decoding with a draft of another tokenizer is token-identical to the target alone.

Tokenizers: a byte-level BPE (target) and a Unigram with byte fallback (draft), trained here on
different text with different vocabulary sizes (tests/any_draft_fixtures.py), saved and loaded with
`from_pretrained`. Random models exercise every odd byte sequence (half characters, stray special
tokens) with almost nothing accepted; a pair trained here to recite one text accepts most drafts,
so commit and rollback of long accepted runs are exercised too.
"""

import pytest
import torch
from any_draft_fixtures import MEMORIZED, PROMPTS, saved_memorized_pair, saved_tokenizers
from tiny_models import reference_greedy, tiny_model

from assisted_backends import generate

NEW = 24


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("any_draft")


@pytest.fixture(scope="module")
def tokenizers(workdir):
    return saved_tokenizers(workdir)


@pytest.fixture(scope="module")
def memorized(workdir):
    return saved_memorized_pair(workdir)


def _identical_translated_greedy(target, draft, target_tokenizer, draft_tokenizer, prompt: str, gamma: int):
    """Assisted greedy generation across tokenizers, asserted token-identical to the target alone."""
    ids = target_tokenizer(prompt, return_tensors="pt").input_ids
    result = generate(
        target,
        ids,
        assistant_model=draft,
        tokenizer=target_tokenizer,
        assistant_tokenizer=draft_tokenizer,
        max_new_tokens=NEW,
        num_assistant_tokens=gamma,
    )
    assert torch.equal(result.sequences, reference_greedy(target, ids, NEW)), prompt
    return result


@pytest.mark.parametrize("direction", ["bpe_target", "unigram_target"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_random_models_greedy_identity_over_many_prompts(tokenizers, direction, gamma):
    bpe, unigram = tokenizers
    target_tokenizer, draft_tokenizer = (bpe, unigram) if direction == "bpe_target" else (unigram, bpe)
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer))
    draft = tiny_model("gpt2", seed=1, vocab=len(draft_tokenizer), hidden=32, layers=1)
    drafted = 0
    for prompt in PROMPTS:
        result = _identical_translated_greedy(target, draft, target_tokenizer, draft_tokenizer, prompt, gamma)
        assert result.stats.drafter == "draft_model_translated"
        assert result.stats.drafted <= gamma * result.stats.rounds
        drafted += result.stats.drafted
    assert drafted > 0, "the draft must have proposed something"


@pytest.mark.parametrize("gamma,floor", [(2, 0.5), (5, 0.45)])
def test_trained_pair_accepts_drafts_and_stays_identical(memorized, gamma, floor):
    target, draft, target_tokenizer, draft_tokenizer = memorized
    accepted = drafted = 0
    for phrase in ("once upon a", "little robot", "every night.", "one, two,", "Café, naïve:"):
        prompt = MEMORIZED[: MEMORIZED.index(phrase) + len(phrase)]
        result = _identical_translated_greedy(target, draft, target_tokenizer, draft_tokenizer, prompt, gamma)
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
        stats = result.stats
        assert stats.acceptance_rate == stats.accepted / stats.drafted
    # Random drafts accept ~0; this pair measured α = 0.60 at γ=2 and 0.55 at γ=5 (deterministic training).
    assert accepted / drafted > floor, (
        f"translation must let a draft that knows the text be accepted: α={accepted / drafted}"
    )


def test_left_padded_prompt(tokenizers):
    target_tokenizer, draft_tokenizer = tokenizers
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer))
    draft = tiny_model("gpt2", seed=1, vocab=len(draft_tokenizer), hidden=32, layers=1)
    ids = target_tokenizer("café 12  34", return_tensors="pt").input_ids
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], dim=1)
    result = generate(
        target,
        padded,
        attention_mask=mask,
        assistant_model=draft,
        tokenizer=target_tokenizer,
        assistant_tokenizer=draft_tokenizer,
        max_new_tokens=NEW,
    )
    assert torch.equal(result.sequences[:, 3:], reference_greedy(target, ids, NEW))


def test_same_vocabulary_uses_the_ordinary_draft_model(tokenizers):
    target_tokenizer, _ = tokenizers
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer))
    ids = target_tokenizer("once upon", return_tensors="pt").input_ids
    result = generate(
        target,
        ids,
        assistant_model=target,
        tokenizer=target_tokenizer,
        assistant_tokenizer=target_tokenizer,
        max_new_tokens=8,
        num_assistant_tokens=3,
    )
    assert result.stats.drafter == "draft_model"
    assert result.stats.acceptance_rate == 1.0


def test_static_shapes_with_another_tokenizer_is_refused(tokenizers):
    target_tokenizer, draft_tokenizer = tokenizers
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer))
    draft = tiny_model("gpt2", seed=1, vocab=len(draft_tokenizer), hidden=32, layers=1)
    ids = target_tokenizer("once upon", return_tensors="pt").input_ids
    with pytest.raises(NotImplementedError, match="static_shapes=True with a draft of another tokenizer"):
        generate(
            target,
            ids,
            assistant_model=draft,
            tokenizer=target_tokenizer,
            assistant_tokenizer=draft_tokenizer,
            max_new_tokens=4,
            static_shapes=True,
        )


def test_different_vocabularies_without_tokenizers_asks_for_them(tokenizers):
    target_tokenizer, draft_tokenizer = tokenizers
    target = tiny_model("llama", seed=0, vocab=len(target_tokenizer))
    draft = tiny_model("gpt2", seed=1, vocab=len(draft_tokenizer), hidden=32, layers=1)
    with pytest.raises(ValueError, match="pass tokenizer= .* and assistant_tokenizer="):
        generate(target, torch.tensor([[1, 2]]), assistant_model=draft, max_new_tokens=2)
    # tokenizer= alone is the stop strings' tokenizer, as in model.generate: no translation asked for
    with pytest.raises(ValueError, match="pass tokenizer= .* and assistant_tokenizer="):
        generate(target, torch.tensor([[1, 2]]), assistant_model=draft, tokenizer=target_tokenizer, max_new_tokens=2)
    with pytest.raises(ValueError, match="pass both tokenizer="):
        generate(
            target, torch.tensor([[1, 2]]), assistant_model=draft, assistant_tokenizer=draft_tokenizer, max_new_tokens=2
        )

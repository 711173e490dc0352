"""Rule 1: greedy assisted output is token-identical to the target's own greedy `model.generate`."""

from functools import cache

import pytest
import torch
from tiny_models import ARCHITECTURES, noisy_copy, random_prompt, reference_greedy, tiny_model

from assisted_backends import generate

PROMPT_LENGTHS = (1, 6, 17)
MAX_NEW_TOKENS = 23  # divisible by none of K + 1 for K in (1, 3, 8)


@cache
def pair(arch: str, draft_kind: str):
    target = tiny_model(arch, seed=0)
    drafts = {
        "self": lambda: target,  # every token accepted
        "unrelated": lambda: tiny_model(arch, seed=1),  # almost nothing accepted
        "smaller": lambda: tiny_model(arch, seed=2, hidden=32, layers=1),  # another size
        "noisy": lambda: noisy_copy(target, seed=3, scale=0.02),  # partial acceptance
    }
    return target, drafts[draft_kind]()


@cache
def expected(arch: str, prompt_length: int) -> torch.Tensor:
    target, _ = pair(arch, "self")
    return reference_greedy(target, random_prompt(prompt_length, seed=prompt_length), MAX_NEW_TOKENS)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("layout", ["dynamic", "static"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("draft_kind", ["self", "unrelated", "smaller", "noisy"])
def test_assisted_greedy_matches_target_generate(arch, layout, gamma, draft_kind):
    target, draft = pair(arch, draft_kind)
    for prompt_length in PROMPT_LENGTHS:
        prompt = random_prompt(prompt_length, seed=prompt_length)
        result = generate(
            target,
            prompt,
            assistant_model=draft,
            max_new_tokens=MAX_NEW_TOKENS,
            num_assistant_tokens=gamma,
            cache_layout=layout,
            device="cpu",
        )
        assert torch.equal(result.sequences, expected(arch, prompt_length)), (arch, layout, gamma, prompt_length)
        assert result.stats.new_tokens == MAX_NEW_TOKENS


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_plain_decoding_through_the_loop_matches_generate(arch, layout):
    target, _ = pair(arch, "self")
    prompt = random_prompt(6, seed=6)
    result = generate(target, prompt, max_new_tokens=MAX_NEW_TOKENS, cache_layout=layout)
    assert torch.equal(result.sequences, expected(arch, 6))
    assert result.stats.drafted == 0 and result.stats.rounds == MAX_NEW_TOKENS - 1


def test_partial_acceptance_is_exercised():
    """The noisy pair must reject some and accept some, or the identity tests above prove less."""
    target, draft = pair("llama", "noisy")
    result = generate(
        target, random_prompt(6, seed=6), assistant_model=draft, max_new_tokens=60, num_assistant_tokens=3
    )
    assert 0.2 < result.stats.acceptance_rate < 0.95


def test_left_padded_prompt_matches_generate():
    target, draft = pair("llama", "noisy")
    prompt = random_prompt(8, seed=8)
    mask = torch.ones_like(prompt)
    mask[:, :3] = 0
    with torch.inference_mode():
        expected_ids = target.generate(prompt, attention_mask=mask, max_new_tokens=15, do_sample=False, pad_token_id=0)
    result = generate(target, prompt, attention_mask=mask, assistant_model=draft, max_new_tokens=15)
    assert torch.equal(result.sequences, expected_ids)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_static_shapes_match_dynamic(arch):
    target, draft = pair(arch, "noisy")
    prompt = random_prompt(17, seed=17)
    fixed = generate(target, prompt, assistant_model=draft, max_new_tokens=MAX_NEW_TOKENS, static_shapes=True)
    assert fixed.stats.cache_layout == "static"
    assert torch.equal(fixed.sequences, expected(arch, 17))

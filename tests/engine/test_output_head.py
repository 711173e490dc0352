"""The target's head on demand (`engine.head_on_demand`): greedy verification computes the logits of position 1
first and the other γ positions only when some row accepted x_1.

What is asserted: tokens equal the target's own `model.generate` on architectures whose forward
transforms the head's output (Gemma 2/3 soft-capping, Cohere's logit scale, Granite's logits scaling,
chosen large enough to change the tokens) and on plain ones, with the on-demand path really taken
(`head_positions_skipped` > 0); a transform the module does not know turns it off (the bit-for-bit
check at the prefill) with the tokens still exact; static shapes, sampling and backends that do not
ask for it never take it.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch
from architectures import VERSION, UnknownArchitecture, build, refused_here
from test_architecture_matrix import reference, repetitive_prompt
from transformers import LlamaForCausalLM

from assisted_backends import generate
from assisted_backends.engine.head_on_demand import HeadSplit, OnDemandHead

pytestmark = pytest.mark.usefixtures("one_thread", "one_token_matches")  # lookups to verify on random models

NEW_TOKENS = 24
TRANSFORMED = {  # model_type: config changes that make the transform after the head change the argmax
    "llama": {},
    "gpt2": {"tie_word_embeddings": True},
    "gemma2": {"final_logit_softcapping": 0.5},
    "gemma3_text": {"final_logit_softcapping": 0.5},
    "cohere": {"logit_scale": 0.3},
    "granite": {"logits_scaling": 7.0},
}


def built(model_type: str, seed: int, **changes):
    try:
        return build(model_type, seed=seed, **changes)
    except UnknownArchitecture as error:
        pytest.skip(f"not in the installed transformers: {error}")


# Where the on-demand path must be taken: transformers >= 4.55 and models as transformers builds them. On
# 4.51 GPT-2 takes no logits_to_keep (the prefill's head input then covers every position and the check
# declines), and IPEX's rewritten models (the IPEX lane) are checked too: there only exactness is asserted.
TAKES_THE_PATH = VERSION >= (4, 55) and os.environ.get("ASSISTED_BACKENDS_IPEX", "off") == "off"


@pytest.mark.parametrize("model_type", sorted(TRANSFORMED))
def test_on_demand_head_keeps_greedy_tokens_exact(model_type):
    if refused_here(model_type):
        pytest.skip(f"{model_type} is refused on transformers {VERSION} (hybrid masks)")
    target = built(model_type, seed=0, **TRANSFORMED[model_type])
    draft = built(model_type, seed=1, **TRANSFORMED[model_type])  # unrelated: x_1 mostly rejected
    prompt = repetitive_prompt(15, seed=7)
    settings = dict(repetition_penalty=1.3)  # not invariant under soft-capping: the transform must be applied
    result = generate(
        target, prompt, assistant_model=draft, max_new_tokens=NEW_TOKENS, num_assistant_tokens=4, **settings
    )
    assert torch.equal(result.sequences, reference(target, prompt, torch.ones_like(prompt), NEW_TOKENS, **settings))
    if TAKES_THE_PATH:
        assert result.stats.head_positions_skipped > 0, "the on-demand head must have skipped positions"


def test_the_transform_after_the_head_matters_in_these_cases():
    """Guards the test above: without Gemma 2's soft-capping the logits (and so the check) would differ."""
    target = built("gemma2", seed=0, **TRANSFORMED["gemma2"])
    head = OnDemandHead.of(target)
    hidden = torch.randn(1, 3, target.config.hidden_size)
    capped = head.logits(hidden)
    raw = head.head(hidden).float()
    assert capped.abs().max() <= 0.5 and not torch.allclose(capped, raw)


class BiasedLlama(LlamaForCausalLM):
    """A Llama whose forward adds a fixed bias to the logits after its head: a transform `OnDemandHead`
    does not know, large enough to change the greedy tokens."""

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        bias = torch.linspace(0, 8, output.logits.shape[-1], dtype=output.logits.dtype)
        output.logits = output.logits + bias
        return output

    forward.__signature__ = inspect.signature(LlamaForCausalLM.forward)  # names the cache argument as this version does


def test_an_unknown_transform_after_the_head_turns_it_off():
    plain = built("llama", seed=0)
    target = BiasedLlama(plain.config).eval()
    target.load_state_dict(plain.state_dict())
    draft = built("llama", seed=1)
    prompt = repetitive_prompt(15, seed=7)
    result = generate(target, prompt, assistant_model=draft, max_new_tokens=NEW_TOKENS, num_assistant_tokens=4)
    assert torch.equal(result.sequences, reference(target, prompt, torch.ones_like(prompt), NEW_TOKENS))
    assert result.stats.head_positions_skipped == 0
    assert OnDemandHead.of(target).checked() is False


@pytest.mark.parametrize(
    "settings",
    [dict(static_shapes=True), dict(do_sample=True, seed=3), dict(prompt_lookup_num_tokens=3, do_sample=True, seed=3)],
    ids=["static_shapes", "sampling", "lookup_sampling"],
)
def test_fixed_shapes_and_sampling_compute_every_position(settings):
    target, draft = built("llama", seed=0), built("llama", seed=1)
    drafting = {} if "prompt_lookup_num_tokens" in settings else dict(assistant_model=draft)
    result = generate(
        target, repetitive_prompt(15, seed=7), max_new_tokens=NEW_TOKENS, num_assistant_tokens=4, **drafting, **settings
    )
    assert result.stats.drafted > 0 and result.stats.head_positions_skipped == 0


def test_a_batch_skips_only_when_no_row_accepted_x1():
    target, draft = built("llama", seed=0), built("llama", seed=1)
    prompts = torch.cat([repetitive_prompt(15, seed=7), repetitive_prompt(15, seed=8)])
    result = generate(target, prompts, assistant_model=draft, max_new_tokens=NEW_TOKENS, num_assistant_tokens=4)
    for row in range(2):
        alone = reference(target, prompts[row : row + 1], torch.ones_like(prompts[:1]), NEW_TOKENS)
        assert torch.equal(result.sequences[row : row + 1], alone)
    assert result.stats.head_positions_skipped > 0


def test_head_split_follows_the_first_position_acceptance_and_the_head_costs():
    split = HeadSplit(weight=0.5)
    assert not split.wanted()  # nothing known: π = 1/2, not below the default threshold 1/2
    split.record_outcome(False)
    assert split.wanted()  # x_1 rejected: π = 1/4
    for _ in range(4):
        split.record_outcome(True)
    assert not split.wanted()  # π ≈ 0.95
    split.record_first(False, seconds=0.010)
    split.record_rest(0.100)  # t_1 / t_rest = 0.1: splitting pays up to π = 0.9
    for _ in range(3):
        split.record_first(False, seconds=0.010)
    assert split.wanted()
    split.first_s = 0.1  # a head over one position costing as much as over all: splitting never pays
    assert not split.wanted()

"""Greedy identity on every decoder-only architecture `tests/architectures.py` builds.

Three parts:
- the matrix: every architecture × draft (self, noisy copy, unrelated random model, early exit,
  prompt lookup) × cache layout, against the target's own `model.generate`, with prompts and
  generations longer than the sliding window, so window, hybrid and chunked layers are rolled back
  after positions dropped out of the window;
- a seeded randomized sweep over architectures, drafters, γ, layouts, static shapes and bucket
  sizes, prompt lengths, EOS inside an accepted span, user left padding and repetition penalty
  (`ASSISTED_BACKENDS_SWEEP_CASES`, default 24 cases; set it to a few hundred for a longer sweep);
- models whose cache cannot roll back get a clear error before generating.
"""

from __future__ import annotations

import os
import random
from functools import cache

import pytest
import torch
import transformers
from architectures import (
    ARCH_NAMES,
    BREADTH_FROM,
    BREADTH_TYPES,
    REFUSED_TYPES,
    VERSION,
    VOCAB,
    WINDOW,
    UnknownArchitecture,
    build,
    refused_here,
)
from tiny_models import noisy_copy

from assisted_backends import generate

pytestmark = pytest.mark.usefixtures("one_thread", "one_token_matches")  # lookups to verify on random models

PROMPT_LENGTH = WINDOW + 3  # the prompt alone already fills the window
NEW_TOKENS = 2 * WINDOW + 1
DRAFTS = ("self", "noisy", "unrelated", "early_exit", "prompt_lookup")
SWEEP_CASES = int(os.environ.get("ASSISTED_BACKENDS_SWEEP_CASES", "24"))


@cache
def target(model_type: str):
    try:
        return build(model_type, seed=0)
    except UnknownArchitecture as error:
        pytest.skip(f"not in the installed transformers: {error}")


@cache
def draft_model(model_type: str, kind: str):
    if kind == "self":
        return target(model_type)
    if kind == "noisy":
        return noisy_copy(target(model_type), seed=3, scale=0.05)
    if kind == "unrelated":
        return build(model_type, seed=1)
    return None


def draft_arguments(model_type: str, kind: str) -> dict:
    """`generate` keywords for draft `kind`."""
    if kind == "early_exit":
        return dict(assistant_early_exit=1)
    if kind == "prompt_lookup":
        return dict(prompt_lookup_num_tokens=3)
    return dict(assistant_model=draft_model(model_type, kind))


def repetitive_prompt(length: int, seed: int) -> torch.Tensor:
    """A prompt that repeats a short random phrase, so prompt lookup finds matches (and misses)."""
    phrase = torch.randint(0, VOCAB, (5,), generator=torch.Generator().manual_seed(seed))
    noise = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed + 1))
    tokens = torch.where(torch.arange(length) % 7 < 5, phrase[torch.arange(length) % 5], noise)
    return tokens[None, :]


def reference(model, prompt: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, **settings) -> torch.Tensor:
    """The target's own greedy `model.generate` with the same inputs and settings."""
    with torch.inference_mode():
        return model.generate(
            prompt, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, **settings
        )


@cache
def matrix_reference(model_type: str) -> torch.Tensor:
    prompt = repetitive_prompt(PROMPT_LENGTH, seed=7)
    return reference(target(model_type), prompt, torch.ones_like(prompt), NEW_TOKENS)


@pytest.mark.parametrize("layout", ["dynamic", "static"])
@pytest.mark.parametrize("kind", DRAFTS)
@pytest.mark.parametrize("model_type", ARCH_NAMES)
def test_greedy_identity_on_every_architecture(model_type, kind, layout):
    model = target(model_type)
    prompt = repetitive_prompt(PROMPT_LENGTH, seed=7)
    arguments = dict(max_new_tokens=NEW_TOKENS, num_assistant_tokens=3, cache_layout=layout, device="cpu")
    arguments.update(draft_arguments(model_type, kind))
    if refused_here(model_type):
        with pytest.raises(NotImplementedError, match="Upgrade: pip install 'transformers>=[45]"):
            generate(model, prompt, **arguments)
        return
    result = generate(model, prompt, **arguments)
    assert torch.equal(result.sequences, matrix_reference(model_type)), (model_type, kind, layout)
    assert result.stats.drafted > 0, "the drafter must have proposed tokens for this case to test a rollback"


def test_the_matrix_rolls_back_past_the_window():
    """The noisy drafts reject tokens after the window is full, so the tests above roll back through it."""
    result = generate(
        target("mistral"),
        repetitive_prompt(PROMPT_LENGTH, seed=7),
        assistant_model=draft_model("mistral", "noisy"),
        max_new_tokens=NEW_TOKENS,
        num_assistant_tokens=3,
    )
    assert 0 < result.stats.accepted < result.stats.drafted


def sweep_case(index: int) -> dict:
    """Case `index` of the randomized sweep: every choice drawn from a generator seeded by `index`."""
    rng = random.Random(index)
    static_shapes = rng.random() < 0.3
    return dict(
        model_type=rng.choice(ARCH_NAMES),
        kind=rng.choice(DRAFTS),
        gamma=rng.choice([1, 2, 3, 5, 8]),
        layout="static" if static_shapes else rng.choice(["dynamic", "static"]),
        static_shapes=static_shapes,
        bucket_size=rng.choice([None, 8, 16, 32]),
        prompt_length=rng.randint(1, 2 * WINDOW),
        left_padding=rng.choice([0, 0, 2, 5]),
        repetition_penalty=rng.choice([None, None, 1.3]),
        eos_position=rng.choice([None, None, rng.randint(2, NEW_TOKENS - 2)]),
        seed=rng.randint(0, 10_000),
    )


@pytest.mark.parametrize("index", range(SWEEP_CASES))
def test_randomized_sweep(index):
    case = sweep_case(index)
    if refused_here(case["model_type"]):
        pytest.skip(f"{case['model_type']} is refused by this transformers (tested in the matrix above)")
    model = target(case["model_type"])
    length = case["prompt_length"] + case["left_padding"]
    prompt = repetitive_prompt(length, seed=case["seed"])
    mask = torch.ones_like(prompt)
    mask[:, : case["left_padding"]] = 0
    settings = {}
    if case["repetition_penalty"] is not None:
        settings["repetition_penalty"] = case["repetition_penalty"]
    if case["eos_position"] is not None:  # EOS := a token the target generates there, so the run stops early
        unconstrained = reference(model, prompt, mask, NEW_TOKENS, **settings)
        settings["eos_token_id"] = int(unconstrained[0, length + case["eos_position"]])
    expected = reference(model, prompt, mask, NEW_TOKENS, **settings)

    result = generate(
        model,
        prompt,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        num_assistant_tokens=case["gamma"],
        cache_layout=case["layout"],
        static_shapes=case["static_shapes"],
        bucket_size=case["bucket_size"],
        device="cpu",
        **draft_arguments(case["model_type"], case["kind"]),
        **settings,
    )
    assert torch.equal(result.sequences, expected), case


@pytest.mark.parametrize("model_type", BREADTH_TYPES)
def test_greedy_identity_on_the_other_architectures(model_type):
    """Every other decoder-only architecture that builds tiny: a perturbed draft on the dynamic layout, prompt
    lookup on the static one."""
    if VERSION < BREADTH_FROM:
        pytest.skip(f"the breadth set was found on transformers 5.x; {transformers.__version__} is older")
    model = target(model_type)
    prompt = repetitive_prompt(PROMPT_LENGTH, seed=7)
    expected = reference(model, prompt, torch.ones_like(prompt), NEW_TOKENS)
    draft = noisy_copy(model, seed=3, scale=0.05)
    for layout, drafting in (("dynamic", dict(assistant_model=draft)), ("static", dict(prompt_lookup_num_tokens=3))):
        result = generate(
            model, prompt, max_new_tokens=NEW_TOKENS, num_assistant_tokens=3, cache_layout=layout, **drafting
        )
        assert torch.equal(result.sequences, expected), (model_type, layout, list(drafting))


@pytest.mark.parametrize("model_type", REFUSED_TYPES)
def test_models_that_cannot_roll_back_are_refused(model_type):
    model = target(model_type)
    with pytest.raises(NotImplementedError, match="assisted decoding needs|cannot be rolled back|cannot roll back"):
        generate(model, repetitive_prompt(PROMPT_LENGTH, seed=7), prompt_lookup_num_tokens=3, max_new_tokens=4)


def test_a_recurrent_model_is_refused_before_generating():
    try:
        from transformers import MambaConfig, MambaForCausalLM
    except ImportError:
        pytest.skip("this transformers has no Mamba")
    config = MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=4, num_hidden_layers=1)
    mamba = MambaForCausalLM(config).eval()
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(NotImplementedError, match="cannot be rolled back"):
        generate(mamba, prompt, prompt_lookup_num_tokens=2, max_new_tokens=4)


def test_a_draft_with_linear_attention_layers_is_refused():
    model = build("llama", seed=0)
    model.config.layer_types = ["full_attention", "linear_attention"]
    try:
        with pytest.raises(NotImplementedError, match="linear_attention"):
            generate(build("llama", seed=1), torch.tensor([[1, 2, 3]]), assistant_model=model, max_new_tokens=4)
    finally:
        del model.config.layer_types

"""Identity means `model.generate`'s behaviour with the same inputs and configs (docs/design.md rules 1 and 11).

Every test compares against the target's own `model.generate` on tiny random models, with no
drafter, a self-draft, prompt lookup, and static shapes (bucket padding); each also checks that the
setting it tests changes the tokens, so the comparison can fail.
"""

import inspect
from functools import cache

import pytest
import torch
from tiny_models import random_prompt, tiny_model
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from assisted_backends import generate
from assisted_backends.options import fields as generation_fields

NEW = 16
IGNORES_PADDING = "prompt_ignore_length" in inspect.signature(RepetitionPenaltyLogitsProcessor.__init__).parameters
DRAFTERS = {
    "none": lambda t: {},
    "self": lambda t: dict(assistant_model=t, num_assistant_tokens=3),
    "lookup": lambda t: dict(prompt_lookup_num_tokens=3),
    "static": lambda t: dict(assistant_model=t, num_assistant_tokens=3, static_shapes=True, bucket_size=16),
}


@cache
def target(arch: str = "llama", eos: int | None = None):
    return tiny_model(arch, seed=0, eos_token_id=eos)


def reference(model, prompt, mask=None, **kwargs):
    mask = torch.ones_like(prompt) if mask is None else mask
    with torch.inference_mode():
        return model.generate(prompt, attention_mask=mask, **kwargs)


def greedy_path(model, prompt, new=NEW):
    return reference(model, prompt, max_new_tokens=new, do_sample=False)[0, prompt.shape[1] :].tolist()


# 1. Repetition penalty ignores padding (the caller's left padding and static-shape bucket padding).


@pytest.mark.parametrize("arch", ["llama", "opt", "gpt2", "gpt_bigcode"])
def test_repetition_penalty_ignores_left_padding(arch):
    model = target(arch)
    prompt = random_prompt(6, seed=6)
    path = reference(model, prompt, max_new_tokens=NEW, repetition_penalty=1.5, pad_token_id=0)[:, 6:]
    padded = torch.cat([path[:, :4], prompt], dim=1)  # padding slots hold tokens the penalty would hit
    mask = torch.ones_like(padded)
    mask[:, :4] = 0
    expected = reference(model, padded, mask, max_new_tokens=NEW, repetition_penalty=1.5, pad_token_id=0)
    penalised = reference(
        model,
        padded,
        mask,
        max_new_tokens=NEW,
        logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)]),
        pad_token_id=0,
    )
    if IGNORES_PADDING:  # transformers 5.x; 4.x penalises the padding, and so does this package there
        assert not torch.equal(expected, penalised), "penalising the padding must change the tokens here"
    for name, drafter in DRAFTERS.items():
        result = generate(
            model, padded, attention_mask=mask, max_new_tokens=NEW, repetition_penalty=1.5, **drafter(model)
        )
        assert torch.equal(result.sequences, expected), (arch, name)


def test_repetition_penalty_ignores_bucket_padding():
    model = target()
    prompt = random_prompt(6, seed=6)
    pad = greedy_path(model, prompt)[1]
    assert pad not in prompt[0].tolist()  # else model.generate would infer an attention mask
    expected = reference(model, prompt, max_new_tokens=NEW, repetition_penalty=1.5, pad_token_id=pad)
    with_pad = torch.cat([torch.full((1, 10), pad), prompt], dim=1)  # what penalising the bucket padding means
    penalised = reference(
        model,
        with_pad,
        torch.cat([torch.zeros(1, 10, dtype=torch.long), torch.ones_like(prompt)], dim=1),
        max_new_tokens=NEW,
        logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)]),
        pad_token_id=pad,
    )
    assert not torch.equal(expected[:, 6:], penalised[:, 16:])
    for drafter in ("none", "static"):
        kwargs = dict(DRAFTERS[drafter](model), static_shapes=True, bucket_size=16)
        result = generate(model, prompt, max_new_tokens=NEW, repetition_penalty=1.5, pad_token_id=pad, **kwargs)
        assert torch.equal(result.sequences, expected), drafter


# 2. GenerationConfig fields that change tokens are honoured.


def _field_cases(path: list[int]) -> dict[str, dict]:
    return {
        "no_repeat_ngram_size": dict(no_repeat_ngram_size=1),
        "suppress_tokens": dict(suppress_tokens=path[1:3]),
        "begin_suppress_tokens": dict(begin_suppress_tokens=[path[0]]),
        "bad_words_ids": dict(bad_words_ids=[[path[2], path[3]], [path[5]]]),
        "min_new_tokens": dict(min_new_tokens=5, eos_token_id=path[2]),
        "min_length": dict(min_length=12, eos_token_id=path[2]),
        "sequence_bias": dict(sequence_bias={(path[4],): -100.0}),
        "forced_eos_token_id": dict(forced_eos_token_id=3),
        "exponential_decay_length_penalty": dict(exponential_decay_length_penalty=(3, 1.5), eos_token_id=5),
        "repetition_penalty": dict(repetition_penalty=1.5),
        "encoder_repetition_penalty": dict(encoder_repetition_penalty=1.5),
        "renormalize_logits": dict(renormalize_logits=True, remove_invalid_values=True, repetition_penalty=1.2),
    }


FIELDS = list(_field_cases(list(range(8))))


@pytest.mark.parametrize("field", FIELDS)
def test_generation_config_field_is_honoured(field):
    model = target()
    prompt = random_prompt(6, seed=6)
    path = greedy_path(model, prompt)
    config = GenerationConfig(max_new_tokens=NEW, **_field_cases(path)[field])
    expected = reference(model, prompt, generation_config=config)
    assert expected[0, 6:].tolist() != path, f"{field} must change the greedy tokens here"
    for name, drafter in DRAFTERS.items():
        result = generate(model, prompt, generation_config=config, **drafter(model))
        assert torch.equal(result.sequences, expected), (field, name)
    by_name = generate(model, prompt, **config.to_diff_dict() | dict(max_new_tokens=NEW))  # as model.generate(**kw)
    assert torch.equal(by_name.sequences, expected)


def _active_value(name: str):
    values = {
        "num_beams": 2, "num_beam_groups": 2, "diversity_penalty": 0.5, "penalty_alpha": 0.6, "dola_layers": "low",
        "guidance_scale": 1.5, "num_return_sequences": 2, "max_time": 1.0, "token_healing": True,
        "constraints": [object()], "force_words_ids": [[1]], "use_mtp": True, "assistant_ensemble_weight": 0.5,
        "speculation_type": "dflash", "forced_decoder_ids": [[1, 5]], "generation_kwargs": {"num_beams": 2},
    }  # fmt: skip
    return values[name]


FIELDS_HERE = set(GenerationConfig().to_dict())  # the installed transformers' fields
REFUSED_ACTIVE = [
    name
    for name, _, _ in generation_fields.REFUSED
    if name in FIELDS_HERE and name not in ("length_penalty", "watermarking_config")
]


@pytest.mark.parametrize("name", REFUSED_ACTIVE)
def test_fields_that_cannot_be_honoured_are_refused_by_name(name):
    config = GenerationConfig(max_new_tokens=4)
    setattr(config, name, _active_value(name))  # bypasses GenerationConfig's own validation
    with pytest.raises(ValueError, match=f"generation_config.{name}="):
        generate(target(), random_prompt(5, seed=5), generation_config=config)


def test_watermarking_is_refused():
    from transformers.generation import WatermarkingConfig

    config = GenerationConfig(max_new_tokens=4, watermarking_config=WatermarkingConfig())
    with pytest.raises(ValueError, match="generation_config.watermarking_config="):
        generate(target(), random_prompt(5, seed=5), generation_config=config)


def test_every_generation_config_field_is_classified():
    """A field a new transformers adds must be classified before it can be silently ignored."""
    fields = {name for name in GenerationConfig().to_dict() if not name.startswith("_")}
    refused = {name for name, _, _ in generation_fields.REFUSED}
    classified = [generation_fields.HONOURED, refused, generation_fields.NO_TOKEN_EFFECT]
    assert fields - set().union(*classified) == set()
    assert not (generation_fields.HONOURED & refused)
    assert not (generation_fields.HONOURED & generation_fields.NO_TOKEN_EFFECT)
    assert not (refused & generation_fields.NO_TOKEN_EFFECT)


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_repeat_ngram'"):
        generate(target(), random_prompt(5, seed=5), max_new_tokens=3, no_repeat_ngram=2)


# 3. The model's own generation_config supplies defaults, merged as model.generate merges them.


@cache
def sampling_target():
    return tiny_model("llama", seed=0, init=0.1)  # flatter logits: top-k and friends change the draws


def _seeded_plain(model, prompt, seed, **kwargs):
    torch.manual_seed(seed)
    with torch.inference_mode():
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, **kwargs)
    torch.manual_seed(seed)
    return expected, generate(model, prompt, max_new_tokens=NEW, **kwargs).sequences


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(do_sample=True),
        dict(do_sample=True, temperature=0.7, top_p=0.9, min_p=0.05, no_repeat_ngram_size=1),
        dict(do_sample=True, typical_p=0.8, repetition_penalty=1.2),
        dict(do_sample=True, epsilon_cutoff=0.01, eta_cutoff=0.01),
        pytest.param(
            dict(do_sample=True, top_h=0.5, renormalize_logits=True),
            marks=pytest.mark.skipif(
                "top_h" not in GenerationConfig().to_dict(), reason="no top_h in this transformers"
            ),
        ),
    ],
)
def test_sampling_draws_what_model_generate_draws(kwargs):
    """No drafter, the global RNG: the same processed distribution gives the very same draws."""
    model, prompt = sampling_target(), random_prompt(6, seed=6)
    for seed in range(3):
        expected, result = _seeded_plain(model, prompt, seed, **kwargs)
        assert torch.equal(result, expected), seed


def test_sampling_defaults_to_top_k_50():
    """model.generate samples from the top 50 by default; without it the draws differ."""
    model, prompt = sampling_target(), random_prompt(6, seed=6)
    differs = 0
    for seed in range(3):
        expected, result = _seeded_plain(model, prompt, seed, do_sample=True)
        assert torch.equal(result, expected)
        _, unrestricted = _seeded_plain(model, prompt, seed, do_sample=True, top_k=0)
        differs += not torch.equal(unrestricted, expected)
    assert differs > 0


def test_self_draft_sampling_with_prefix_processors_accepts_everything():
    """q and p see the same prefix (extended by the earlier drafts), so a self-draft is never rejected."""
    model, prompt = sampling_target(), random_prompt(6, seed=6)
    result = generate(
        model, prompt, assistant_model=model, max_new_tokens=40, do_sample=True, no_repeat_ngram_size=1,
        repetition_penalty=1.3, num_assistant_tokens=4, seed=0,
    )  # fmt: skip
    tokens = result.sequences[0, 6:].tolist()
    assert len(set(tokens)) == len(tokens)  # no_repeat_ngram_size=1 held
    assert result.stats.acceptance_rate > 0.95


@pytest.mark.parametrize(
    "fields",
    [
        dict(repetition_penalty=1.4),
        dict(no_repeat_ngram_size=1),
        dict(do_sample=True, top_k=3, temperature=0.8),
    ],
)
def test_model_generation_config_supplies_defaults(fields):
    model = tiny_model("llama", seed=0, init=0.1)
    prompt = random_prompt(6, seed=6)
    plain = greedy_path(model, prompt)
    for name, value in fields.items():
        setattr(model.generation_config, name, value)
    for seed in range(2):
        torch.manual_seed(seed)
        with torch.inference_mode():
            expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW)
        torch.manual_seed(seed)
        result = generate(model, prompt, max_new_tokens=NEW)
        assert torch.equal(result.sequences, expected), seed
    if not fields.get("do_sample"):
        assert expected[0, 6:].tolist() != plain
        for name, drafter in DRAFTERS.items():
            assert torch.equal(generate(model, prompt, max_new_tokens=NEW, **drafter(model)).sequences, expected), name
    # A passed generation_config's unset fields still fall back to the model's; explicit arguments win.
    torch.manual_seed(0)
    with torch.inference_mode():
        expected = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), generation_config=GenerationConfig(max_new_tokens=NEW)
        )
    torch.manual_seed(0)
    assert torch.equal(
        generate(model, prompt, generation_config=GenerationConfig(max_new_tokens=NEW)).sequences, expected
    )
    overridden = generate(
        model, prompt, max_new_tokens=NEW, do_sample=False, repetition_penalty=1.0, no_repeat_ngram_size=0
    )
    assert overridden.sequences[0, 6:].tolist() == plain


def test_forced_bos_after_a_one_token_prompt():
    model = target()
    prompt = random_prompt(1, seed=1)
    forced = (greedy_path(model, prompt)[0] + 1) % 128
    expected = reference(model, prompt, max_new_tokens=NEW, forced_bos_token_id=forced)
    assert expected[0, 1] == forced
    for name, drafter in DRAFTERS.items():
        result = generate(model, prompt, max_new_tokens=NEW, forced_bos_token_id=forced, **drafter(model))
        assert torch.equal(result.sequences, expected), name


def test_max_length_alone_counts_left_padding():
    model = target()
    prompt = random_prompt(8, seed=8)
    mask = torch.ones_like(prompt)
    mask[:, :3] = 0
    config = GenerationConfig(max_length=15)
    expected = reference(model, prompt, mask, generation_config=config, pad_token_id=0)
    assert expected.shape[1] == 15
    for name, drafter in DRAFTERS.items():
        result = generate(model, prompt, attention_mask=mask, generation_config=config, **drafter(model))
        assert torch.equal(result.sequences, expected), name
    with pytest.raises(ValueError, match="max_length=8 leaves no room"):
        generate(model, prompt, generation_config=GenerationConfig(max_length=8))


def test_model_generation_config_max_length():
    model = tiny_model("llama", seed=0)
    model.generation_config.max_length = 11
    prompt = random_prompt(5, seed=5)
    expected = reference(model, prompt)
    assert expected.shape[1] == 11
    assert torch.equal(generate(model, prompt, assistant_model=model).sequences, expected)


# 5. Without an attention_mask, pad tokens in the prompt are masked as model.generate infers.


def test_attention_mask_is_inferred_from_pad_tokens():
    model = target()
    prompt = random_prompt(7, seed=7)
    pad = 1 if 1 not in prompt[0].tolist() else 2
    padded = torch.cat([torch.full((1, 3), pad), prompt], dim=1)
    with torch.inference_mode():
        expected = model.generate(padded, max_new_tokens=NEW, do_sample=False, pad_token_id=pad)
        unmasked = reference(model, padded, max_new_tokens=NEW, do_sample=False, pad_token_id=pad)
    assert not torch.equal(expected, unmasked)
    for name, drafter in DRAFTERS.items():
        result = generate(model, padded, max_new_tokens=NEW, pad_token_id=pad, **drafter(model))
        assert torch.equal(result.sequences, expected), name


def test_pad_tokens_equal_to_eos_are_not_masked():
    model = target()
    prompt = random_prompt(7, seed=7)
    eos = int(prompt[0, 0])
    expected = reference(model, prompt, max_new_tokens=NEW, pad_token_id=eos, eos_token_id=eos)
    result = generate(model, prompt, max_new_tokens=NEW, pad_token_id=eos, eos_token_id=eos)
    assert torch.equal(result.sequences, expected)


# 4. The caller's models leave a call in the training mode they entered it with.


def test_training_mode_is_restored_and_calls_stay_exact():
    model = tiny_model("gpt2", seed=0)  # GPT-2 has dropout: train mode changes the tokens
    prompt = random_prompt(6, seed=6)
    expected = reference(model.eval(), prompt, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    model.train()
    torch.manual_seed(0)
    with torch.inference_mode():
        dropped = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, do_sample=False)
    assert not torch.equal(dropped, expected), "dropout must change the tokens for this test to mean anything"
    for _ in range(2):
        for name, drafter in DRAFTERS.items():
            model.train()
            result = generate(model, prompt, max_new_tokens=NEW, **drafter(model))
            assert torch.equal(result.sequences, expected), name
            assert model.training and all(m.training for m in model.modules()), name
    model.eval()
    generate(model, prompt, max_new_tokens=3)
    assert not model.training


def test_pad_tokens_inside_the_prompt_are_masked_as_model_generate_masks_them():
    model = target("opt")  # pad_token_id 1
    prompt = torch.tensor([[5, 9, 1, 7, 1, 3]])
    with torch.inference_mode():
        expected = model.generate(prompt, max_new_tokens=NEW, do_sample=False)  # it infers the mask from pad tokens
    attended = reference(model, prompt, max_new_tokens=NEW, do_sample=False)  # `reference` passes a mask of ones
    assert not torch.equal(expected, attended), "masking the pad tokens must change the tokens here"
    for drafting in ({}, {"prompt_lookup_num_tokens": 2}, {"assistant_model": model, "num_assistant_tokens": 2}):
        assert torch.equal(generate(model, prompt, max_new_tokens=NEW, **drafting).sequences, expected), drafting


def test_dtype_is_kept_without_a_dtype_argument():
    model = tiny_model("llama", seed=0).to(torch.bfloat16)
    generate(model, random_prompt(5, seed=5), max_new_tokens=3, assistant_model=model)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_verify_distributions_see_the_draft_extended_prefix_without_padding(monkeypatch):
    """Every p (and q) the loop computes equals transformers' processors applied, position by position,
    to the prompt without bucket padding plus the committed and earlier draft tokens."""
    from transformers.generation.logits_process import (
        NoRepeatNGramLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
    )

    from assisted_backends.engine import sampling

    model = sampling_target()
    draft = tiny_model("llama", seed=1, init=0.1)
    prompt = torch.cat([torch.tensor([[7, 7]]), random_prompt(6, seed=6)], dim=1)
    mask = torch.ones_like(prompt)
    mask[:, :2] = 0
    penalty = (
        RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=torch.tensor([2]))
        if IGNORES_PADDING
        else RepetitionPenaltyLogitsProcessor(1.3)
    )
    expected_processors = [penalty, NoRepeatNGramLogitsProcessor(2), TemperatureLogitsWarper(0.8), TopKLogitsWarper(20)]
    calls = []
    bucket_pad = (-prompt.shape[1]) % 16  # static shapes pad the 8-token prompt to 16
    original = sampling.TokenSelector.scores  # p and q are softmaxes of these

    def spy(self, logits, context, rows=None):
        result = original(self, logits, context, rows)
        calls.append((logits.clone(), context[:, bucket_pad:].clone(), result))
        return result

    monkeypatch.setattr(sampling.TokenSelector, "scores", spy)
    generate(
        model, prompt, attention_mask=mask, assistant_model=draft, max_new_tokens=20, do_sample=True,
        repetition_penalty=1.3, no_repeat_ngram_size=2, temperature=0.8, top_k=20, num_assistant_tokens=3,
        static_shapes=True, bucket_size=16, seed=0,
    )  # fmt: skip
    verified = 0
    for logits, context, result in calls:
        length = context.shape[1]
        for j in range(logits.shape[1]):
            prefix = context[:, : length - (logits.shape[1] - 1 - j)]
            row = logits[:, j].clone()
            for processor in expected_processors:
                row = processor(prefix, row)
            torch.testing.assert_close(result[:, j], row)
        verified += logits.shape[1] > 1
    assert verified >= 3  # verification passes over γ + 1 positions were checked, not only single steps

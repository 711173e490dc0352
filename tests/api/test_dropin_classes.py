"""The drop-in's promise, class by class: every call `model.generate` accepts gives the same tokens, on
`generate(...)`, on `enable(model)` + `model.generate(...)` and, where it applies, on the CLI; and the draft
never decides whether a run happens (docs/design.md rules 1 and 11).

Each test reproduces a class of calls that a user found broken and checks it against transformers' own
`generate` on an identical model.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
import transformers
from test_errors import hf_warns_default_length
from tiny_models import random_prompt, tiny_model
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessor, LogitsProcessorList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

import assisted_backends
from assisted_backends import generate
from assisted_backends.engine.drafter import DraftFailedWarning

pytestmark = pytest.mark.usefixtures("one_thread")


def twins(arch: str = "llama", **config):
    """(a model with the package enabled, an identical one with transformers' own generate)."""
    reference = tiny_model(arch, seed=0)
    for name, value in config.items():
        setattr(reference.generation_config, name, value)
    enabled = assisted_backends.enable(copy.deepcopy(reference))
    return enabled, reference


def plain(model, prompt, **kwargs):
    with torch.inference_mode():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, **kwargs)


# 1. A caller's MaxLengthCriteria / EosTokenCriteria replaces the one generate builds ------------------


@pytest.mark.parametrize("drafting", [{}, {"prompt_lookup_num_tokens": 2}, {"num_assistant_tokens": 3}])
def test_a_callers_length_and_eos_criteria_take_precedence(drafting):
    enabled, reference = twins()
    prompt = random_prompt(5, seed=2)
    path = plain(reference, prompt, max_new_tokens=20)[0, 5:].tolist()
    eos = path[7]  # a token the greedy path reaches: stopping there changes the tokens
    cases = [
        StoppingCriteriaList([MaxLengthCriteria(max_length=10)]),  # 5 new tokens, not 20
        StoppingCriteriaList([EosTokenCriteria(eos_token_id=eos)]),
        StoppingCriteriaList([MaxLengthCriteria(max_length=30), EosTokenCriteria(eos_token_id=[eos, 1])]),
    ]
    extra = {"assistant_model": reference} if "num_assistant_tokens" in drafting else {}
    for criteria in cases:
        expected = plain(reference, prompt, max_new_tokens=20, stopping_criteria=criteria, pad_token_id=0)
        assert expected.shape[1] < 25, "the criterion must stop the reference before max_new_tokens"
        got = plain(enabled, prompt, max_new_tokens=20, stopping_criteria=criteria, pad_token_id=0, **drafting, **extra)
        api = generate(reference, prompt, max_new_tokens=20, stopping_criteria=criteria, pad_token_id=0, **drafting,
                       **extra).sequences  # fmt: skip
        assert torch.equal(got, expected) and torch.equal(api, expected)


# 2. max_length= as a keyword, and no length at all ------------------------------------------------------


def test_max_length_keyword_and_no_length_match_model_generate():
    enabled, reference = twins()
    prompt = random_prompt(4, seed=3)
    assert plain(enabled, prompt, max_length=11).tolist() == plain(reference, prompt, max_length=11).tolist()
    assert generate(reference, prompt, max_length=11).sequences.shape == (1, 11)
    with hf_warns_default_length():  # both warn that the default length is used (transformers 5)
        expected = plain(reference, prompt)
    with pytest.warns(UserWarning, match="generating up to 20 new tokens"):
        got = plain(enabled, prompt, prompt_lookup_num_tokens=2)
    assert torch.equal(got, expected) and got.shape == (1, 24)


# 3. Drafting fields are honoured wherever they are set ----------------------------------------------------


@pytest.mark.parametrize(
    "field, value, drafter",
    [("prompt_lookup_num_tokens", 3, "prompt_lookup"), ("assistant_early_exit", 1, "early_exit")],
)
def test_drafting_fields_on_every_route(field, value, drafter):
    prompt = torch.arange(10, 40)[None] % 17 + 3  # repeats: lookups find matches
    reference = tiny_model("llama", seed=0)
    expected = plain(reference, prompt, max_new_tokens=12)
    routes = {
        "model.generation_config": lambda m: m.generate(prompt, max_new_tokens=12),
        "generation_config=": lambda m: m.generate(
            prompt, generation_config=GenerationConfig(**{field: value}), max_new_tokens=12
        ),  # fmt: skip
        "keyword": lambda m: m.generate(prompt, max_new_tokens=12, **{field: value}),
    }
    for route, call in routes.items():
        enabled, _ = twins(**({field: value} if route == "model.generation_config" else {}))
        with torch.inference_mode():
            assert torch.equal(call(enabled), expected), route
        assert enabled.generate.last_stats.drafter == drafter, route
    api = generate(reference, prompt, generation_config=GenerationConfig(**{field: value}), max_new_tokens=12)
    assert api.stats.drafter == drafter and torch.equal(api.sequences, expected)
    own = copy.deepcopy(reference)
    setattr(own.generation_config, field, value)
    assert generate(own, prompt, max_new_tokens=12).stats.drafter == drafter


def test_num_assistant_tokens_on_the_models_config_fixes_gamma():
    enabled, reference = twins(num_assistant_tokens=5)
    prompt = random_prompt(6, seed=4)
    got = plain(enabled, prompt, assistant_model=reference, max_new_tokens=16)
    assert torch.equal(got, plain(reference, prompt, max_new_tokens=16))
    assert len(enabled.generate.last_stats.per_position_drafted) == 5  # γ = 5 every round


def test_drafting_fields_in_a_models_saved_config_reach_the_cli(tmp_path):
    """A checkpoint whose generation_config.json asks for prompt lookup drafts with it on the command line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from assisted_backends.demo.pair import shipped_pair

    target_dir = shipped_pair().target_dir

    model = AutoModelForCausalLM.from_pretrained(target_dir)
    model.generation_config.prompt_lookup_num_tokens = 4
    model.save_pretrained(tmp_path / "model")
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(tmp_path / "model")
    out = tmp_path / "run.json"
    command = [sys.executable, "-m", "assisted_backends.cli", "-m", str(tmp_path / "model"), "--max-new-tokens",
               "24", "--prompt", "def add(a, b):\n    return a + b\n\ndef add(a, b):", "--json", str(out),
               "--threads", "1"]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(out.read_text())["stats"]["drafter"] == "prompt_lookup"


# 4. eos_token_id=[] with a length penalty and a pad id -------------------------------------------------


def test_empty_eos_list_with_a_length_penalty_and_a_pad_id():
    enabled, reference = twins()
    prompt = random_prompt(5, seed=5)
    kwargs = dict(max_new_tokens=12, eos_token_id=[], exponential_decay_length_penalty=(3, 1.3), pad_token_id=0)
    assert torch.equal(plain(enabled, prompt, **kwargs), plain(reference, prompt, **kwargs))
    with pytest.raises(ValueError, match=r"eos_token_id=\[\] leaves no token to pad finished rows with"):
        generate(reference, prompt, max_new_tokens=4, eos_token_id=[])


# The draft never decides whether a run happens ------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "opt", "llama"])
@pytest.mark.parametrize("static_shapes", [False, True])
def test_a_short_context_draft_runs_to_the_end_with_the_targets_tokens(arch, static_shapes):
    """gpt2/opt drafts have a learned position table of 24 rows (drafting stops there); a llama draft's rotary
    positions simply go past its trained length, as in transformers."""
    target = tiny_model(arch, seed=0)
    draft = tiny_model(arch, seed=0, max_positions=24)
    prompt = random_prompt(8, seed=6)  # the draft's table ends 16 tokens in; 30 are asked for
    expected = plain(target, prompt, max_new_tokens=30)
    result = generate(target, prompt, assistant_model=draft, max_new_tokens=30, num_assistant_tokens=3,
                      static_shapes=static_shapes, bucket_size=16)  # fmt: skip
    assert torch.equal(result.sequences, expected)
    if arch in ("gpt2", "opt"):
        assert "its 24 positions end" in result.stats.drafting_stopped and result.stats.drafting_stopped_at > 0
        assert result.stats.speculative_rounds > 0  # it drafted before its table ended
    else:
        assert result.stats.drafting_stopped is None


def failing_after(model, after: int):
    """`model` whose forward raises after `after` calls (a broken custom model, an out-of-memory error)."""
    calls, original = [0], model.forward

    def forward(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise RuntimeError("simulated draft failure")
        return original(*args, **kwargs)

    model.forward = forward
    return model


@pytest.mark.parametrize("after", [0, 3])
def test_a_draft_that_raises_leaves_plain_decoding_and_the_tokens(after):
    target = tiny_model("llama", seed=0)
    draft = failing_after(tiny_model("llama", seed=0), after)
    prompt = random_prompt(6, seed=7)
    with pytest.warns(DraftFailedWarning, match="simulated draft failure; plain decoding from here on"):
        result = generate(target, prompt, assistant_model=draft, max_new_tokens=20, num_assistant_tokens=3)
    assert torch.equal(result.sequences, plain(target, prompt, max_new_tokens=20))
    assert "RuntimeError: simulated draft failure" in result.stats.drafting_stopped


# Scores and logits ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "drafting", [{}, {"prompt_lookup_num_tokens": 2}, {"assistant_early_exit": 1}, {"num_assistant_tokens": 3}]
)
def test_scores_and_logits_are_the_targets_for_every_committed_token(drafting):
    enabled, reference = twins()
    prompt = random_prompt(6, seed=8)
    kwargs = dict(max_new_tokens=10, repetition_penalty=1.3, return_dict_in_generate=True, output_scores=True,
                  output_logits=True)  # fmt: skip
    expected = plain(reference, prompt, **kwargs)
    extra = {"assistant_model": reference} if "num_assistant_tokens" in drafting else {}
    got = plain(enabled, prompt, **kwargs, **drafting, **extra)
    assert torch.equal(got.sequences, expected.sequences)
    for ours, theirs in ((got.scores, expected.scores), (got.logits, expected.logits)):
        assert len(ours) == len(theirs) == 10
        for a, b in zip(ours, theirs):  # fp32 verify passes over γ + 1 rows: equal up to the last bits
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert not torch.equal(got.scores[3], got.logits[3])  # processed (penalised) scores, raw logits


def test_scores_of_a_batch_per_row():
    reference = tiny_model("llama", seed=0)
    prompts = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (prompts != 0).long()
    result = generate(reference, prompts, attention_mask=mask, max_new_tokens=6, output_scores=True, pad_token_id=0,
                      num_assistant_tokens=2, assistant_model=reference)  # fmt: skip
    for row in range(2):
        alone = prompts[row : row + 1, mask[row].argmax() :]
        expected = plain(reference, alone, max_new_tokens=6, output_scores=True, return_dict_in_generate=True)
        for step, theirs in enumerate(expected.scores):
            torch.testing.assert_close(result.scores[step][row], theirs[0], atol=1e-4, rtol=1e-4)


# Model inputs passed through, a start from BOS, masks with holes --------------------------------------------

TRANSFORMERS_BEFORE_455 = tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (4, 55)
SERVED_AS_455 = pytest.mark.skipif(
    TRANSFORMERS_BEFORE_455,
    reason="right padding, masks with holes and caller position_ids are served as transformers >= 4.55's generate "
    "serves them (docs/dropin.md); 4.51's generate derives positions differently",
)


def test_token_type_ids_and_position_ids_pass_through_as_model_generate_passes_them():
    gpt2 = tiny_model("gpt2", seed=0)
    prompt = random_prompt(6, seed=9)
    types = torch.tensor([[0, 0, 0, 1, 1, 1]])
    expected = plain(gpt2, prompt, max_new_tokens=8, token_type_ids=types)
    assert not torch.equal(expected, plain(gpt2, prompt, max_new_tokens=8)), "token types must change the tokens"
    for drafting in ({}, {"prompt_lookup_num_tokens": 2}, {"assistant_model": gpt2, "num_assistant_tokens": 3}):
        got = generate(gpt2, prompt, max_new_tokens=8, token_type_ids=types, **drafting).sequences
        assert torch.equal(got, expected), drafting
    if TRANSFORMERS_BEFORE_455:
        return  # 4.51's generate re-derives later positions from the mask (see SERVED_AS_455)
    llama = tiny_model("llama", seed=0)
    positions = torch.tensor([[0, 3, 4, 9, 10, 20]])  # rotary: only relative distances matter
    expected = plain(llama, prompt, max_new_tokens=8, position_ids=positions)
    assert not torch.equal(expected, plain(llama, prompt, max_new_tokens=8)), "positions must change the tokens"
    got = generate(llama, prompt, max_new_tokens=8, position_ids=positions, assistant_model=llama).sequences
    assert torch.equal(got, expected)
    assert torch.equal(plain(llama, prompt, max_new_tokens=8, logits_to_keep=1),
                       generate(llama, prompt, max_new_tokens=8, logits_to_keep=1).sequences)  # fmt: skip


def test_no_input_ids_starts_from_bos():
    enabled, reference = twins(bos_token_id=3)
    with torch.inference_mode():
        expected = reference.generate(max_new_tokens=6, do_sample=False)
        assert torch.equal(enabled.generate(max_new_tokens=6, prompt_lookup_num_tokens=2), expected)
    with pytest.raises(ValueError, match="no bos_token_id to start from"):
        generate(tiny_model("llama", seed=0), max_new_tokens=3)


@SERVED_AS_455
@pytest.mark.parametrize("arch", ["llama", "gpt2", "opt"])
def test_right_padding_and_masks_with_holes_are_served(arch):
    model = tiny_model(arch, seed=0)
    prompts = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0], [0, 13, 14, 0, 15]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 1, 0, 1]])
    with torch.inference_mode():
        expected = model.generate(prompts, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    draft = {"assistant_model": model, "num_assistant_tokens": 3}
    for drafting in ({}, {"prompt_lookup_num_tokens": 2}, draft, {**draft, "static_shapes": True, "bucket_size": 8}):
        got = generate(model, prompts, attention_mask=mask, max_new_tokens=8, pad_token_id=0, **drafting).sequences
        assert torch.equal(got, expected), drafting


# Custom processors --------------------------------------------------------------------------------------


class _BanEvenAfterOdd(LogitsProcessor):
    """A caller's own processor (a function of the ids it is given): bans even tokens after an odd one."""

    def __call__(self, input_ids, scores):
        if int(input_ids[0, -1]) % 2:
            scores = scores.clone()
            scores[:, ::2] = -float("inf")
        return scores


def test_a_callers_logits_processor_and_prefix_function_are_applied():
    enabled, reference = twins()
    prompt = random_prompt(6, seed=10)
    processors = LogitsProcessorList([_BanEvenAfterOdd()])
    expected = plain(reference, prompt, max_new_tokens=12, logits_processor=processors)
    assert not torch.equal(expected, plain(reference, prompt, max_new_tokens=12))
    got = plain(enabled, prompt, max_new_tokens=12, logits_processor=processors, assistant_model=reference)
    assert torch.equal(got, expected)

    def allowed(batch_id, ids):
        return list(range(0, 64)) if int(ids[-1]) >= 64 else list(range(64, 128))

    expected = plain(reference, prompt, max_new_tokens=12, prefix_allowed_tokens_fn=allowed)
    got = plain(enabled, prompt, max_new_tokens=12, prefix_allowed_tokens_fn=allowed, prompt_lookup_num_tokens=2)
    assert torch.equal(got, expected)

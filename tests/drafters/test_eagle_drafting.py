"""EAGLE-3 drafting in the one loop: greedy identity with the target's own `model.generate` on several
architectures, both cache layouts and batches, with heads whose drafts get accepted; the drafts the loop makes
are the ones training-time test predicts (so the head's cache holds exactly what training assumed)."""

from __future__ import annotations

from functools import cache

import pytest
import torch
import transformers
from architectures import build, refused_here
from eagle_fixtures import demo_head, demo_prompts, demo_target, trained_head
from tiny_models import random_prompt, reference_greedy

from assisted_backends import generate
from assisted_backends.api.queue import left_padded
from assisted_backends.drafters.eagle.drafter import EagleDrafter
from assisted_backends.drafters.eagle.features import LayerTap
from assisted_backends.train_draft import batches, ttt
from assisted_backends.train_draft.data import featurize

pytestmark = pytest.mark.usefixtures("one_thread")

# Decoder layers called in different ways (hidden states positional or not, tuple outputs or not), window and
# hybrid caches, learned positions: the hooks must find the residual stream in every one.
ARCHS = ("llama", "gemma3_text", "qwen3", "mistral", "gpt2", "opt", "gpt_neox")


@cache
def arch_pair(arch: str):
    target = build(arch, seed=0)
    return target, trained_head(target, steps=30)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_greedy_identity_across_architectures(arch, static):
    if refused_here(arch):
        pytest.skip(f"{arch} is refused on transformers {transformers.__version__} (tests/architectures.py)")
    target, head = arch_pair(arch)
    for seed in (1, 2):
        prompt = random_prompt(9, seed=seed)
        result = generate(
            target, prompt, assistant_model=head, max_new_tokens=24, num_assistant_tokens=3, static_shapes=static
        )
        assert torch.equal(result.sequences, reference_greedy(target, prompt, 24))
        assert result.stats.drafter == "eagle3" and result.stats.drafted > 0


def _demo_prompt(seed: int, length: int = 30) -> torch.Tensor:
    return torch.tensor(demo_prompts(1, length, seed=seed))


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_identity_with_accepted_drafts(gamma, layout):
    target, _ = demo_target()
    head = demo_head()
    accepted = 0
    full_rounds = 0
    for seed in (11, 12, 13):
        prompt = _demo_prompt(seed)
        result = generate(
            target, prompt, assistant_model=head, max_new_tokens=40, num_assistant_tokens=gamma,
            static_shapes=layout == "static",
        )  # fmt: skip
        assert torch.equal(result.sequences, reference_greedy(target, prompt, 40))
        accepted += result.stats.accepted
        full_rounds += result.stats.per_position_accepted[-1]
    assert accepted > 0  # the acceptance and rollback paths ran
    if gamma == 1:
        assert full_rounds > 0  # rounds in which every draft was accepted (the catch-up of γ + 1 columns)


def test_adaptive_schedule_with_plain_rounds_in_between():
    """Plain rounds leave the head behind; its next proposal catches up on every column the target fed."""
    target, _ = demo_target()
    prompt = _demo_prompt(21)
    result = generate(target, prompt, assistant_model=demo_head(), max_new_tokens=48, schedule="adaptive")
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 48))


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_batches_of_different_lengths(static):
    target, _ = demo_target()
    prompts = [demo_prompts(1, n, seed=30 + n)[0] for n in (12, 20, 27)]
    ids, mask = left_padded([torch.tensor(prompt) for prompt in prompts], pad_id=1)
    with torch.inference_mode():
        expected = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=1)
    result = generate(
        target, ids, attention_mask=mask, assistant_model=demo_head(), max_new_tokens=30, num_assistant_tokens=3,
        static_shapes=static, pad_token_id=1,
    )  # fmt: skip
    assert torch.equal(result.sequences, expected)
    assert result.stats.accepted > 0


def test_drafts_are_what_training_time_test_predicts(monkeypatch):
    """Every draft token the loop proposed (where the chain's earlier tokens were accepted) is the head's TTT
    prediction at that anchor and step: the catch-up, the self-fed chain and the rollback of the head's cache
    compute exactly what training computed."""
    target, _ = demo_target()
    head = demo_head()
    proposals: list[tuple[int, list[int]]] = []
    original = EagleDrafter.propose

    def recording(self, slots, gamma, selector, generator):
        length = slots.length
        proposal = original(self, slots, gamma, selector, generator)
        proposals.append((length, slots.ids[0, length : length + gamma].tolist()))
        return proposal

    monkeypatch.setattr(EagleDrafter, "propose", recording)
    prompt = _demo_prompt(41)
    sequence = generate(target, prompt, assistant_model=head, max_new_tokens=50, num_assistant_tokens=3).sequences
    sequence = sequence[0].tolist()

    head.use_target_embedding(target.get_input_embeddings().weight)
    examples = featurize(target, LayerTap(target, head.config.layers_for(6)), [sequence], [prompt.shape[1]], top_k=4)
    batch = batches.collate(examples, batches.vocabulary_lookup(head.t2d), torch.device("cpu"), torch.float32)
    predictions = []
    with torch.no_grad():
        positions = torch.arange(batch.tokens.shape[1])[None]
        attention = ttt.StepAttention(positions < batch.lengths[:, None])
        hidden = head.fuse(batch.features)
        for k in range(3):
            hidden = head(ttt._shift(batch.tokens, 1 + k, 0), hidden, positions + k, attention)
            predictions.append(head.target_ids(head.draft_logits(hidden).argmax(-1))[0].tolist())
    head.use_target_embedding(None)
    compared = 0
    for length, drafted in proposals:
        for k, token in enumerate(drafted):
            if k > 0 and sequence[length + k - 1] != drafted[k - 1]:
                break  # the chain went on from a rejected token: training never sees that input
            assert predictions[k][length - 2] == token
            compared += 1
    assert compared > len(proposals)  # later chain steps were compared too


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_lookup_first_then_the_head(static):
    """`prompt_lookup_num_tokens` with a head: lookup matches where the output repeats its context, the head
    elsewhere; tokens stay the target's."""
    target, tokenizer = demo_target()
    text = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"
    prompt = tokenizer(text, return_tensors="pt").input_ids
    result = generate(
        target, prompt, assistant_model=demo_head(), prompt_lookup_num_tokens=8, max_new_tokens=40,
        num_assistant_tokens=3, static_shapes=static,
    )  # fmt: skip
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 40))
    assert result.stats.drafter == "eagle3+lookup" and result.stats.accepted > 0


def test_rows_that_finish_early_leave_the_batch():
    """An EOS that rows reach at different rounds: finished rows leave (dynamic layout), and the features and the
    head's cache leave with them."""
    target, _ = demo_target()
    prompts = [demo_prompts(1, n, seed=70 + n)[0] for n in (14, 22, 25)]
    ids, mask = left_padded([torch.tensor(prompt) for prompt in prompts], pad_id=1)
    with torch.inference_mode():
        plain = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=1)
    eos = int(plain[0, ids.shape[1] + 8])  # a token row 0 writes after a few steps: rows end at different rounds
    with torch.inference_mode():
        expected = target.generate(
            ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=1, eos_token_id=eos
        )
    result = generate(
        target, ids, attention_mask=mask, assistant_model=demo_head(), max_new_tokens=30, num_assistant_tokens=3,
        pad_token_id=1, eos_token_id=eos,
    )  # fmt: skip
    assert torch.equal(result.sequences, expected)
    assert len({row.new_tokens for row in result.stats.rows}) > 1  # rows did end at different lengths


def test_a_target_whose_forward_hands_nothing_over_stops_the_draft_not_the_call(monkeypatch):
    """A forward that runs no hooks (a captured graph's replay) leaves the head without features: drafting stops
    for the rest of the call, which goes on with plain rounds and the target's tokens."""
    from assisted_backends.drafters.eagle import features

    target, _ = demo_target()
    head = demo_head()  # trained before the hooks go
    monkeypatch.setattr(features.LayerTap, "capture", _no_hooks)
    prompt = _demo_prompt(81)
    result = generate(target, prompt, assistant_model=head, max_new_tokens=20, num_assistant_tokens=3)
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 20))
    assert result.stats.drafted == 0 and "hooks" in result.stats.drafting_stopped


def _no_hooks(self):
    from contextlib import nullcontext

    return nullcontext({})


def test_lookup_first_then_the_head_under_the_adaptive_schedule():
    """The default schedule with both: lookup rounds and head rounds each get their own schedule; the tokens stay
    the target's, and the copied span is drafted by lookup."""
    target, tokenizer = demo_target()
    text = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"
    prompt = tokenizer(text, return_tensors="pt").input_ids
    result = generate(target, prompt, assistant_model=demo_head(), prompt_lookup_num_tokens=8, max_new_tokens=40)
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 40))
    assert result.stats.schedule == "SourceSchedule" and result.stats.accepted > 0

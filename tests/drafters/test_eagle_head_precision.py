"""An EAGLE-3 head's precision (`head_precision`): its linear layers on the package's int8/int4 kernels leave the
tokens the target's own, draft mostly what the float head drafts, and cost fewer bytes; a bad value is refused by
name; without the kernels a quantized head asked for falls back to float, saying why."""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch
from eagle_fixtures import DEMO_DIR, demo_head, demo_prompts, demo_target
from tiny_models import reference_greedy

from assisted_backends import generate
from assisted_backends.cli.args import build_parser
from assisted_backends.drafters.eagle import load_head, save_head
from assisted_backends.drafters.eagle.build import draft_costs, head_precision, prepared_head
from assisted_backends.drafters.eagle.copies import LINEAR_LAYERS, quantized_copy, step_bytes
from assisted_backends.drafters.eagle.features import LayerTap
from assisted_backends.drafters.eagle.precision import (
    AUTO_SCHEME,
    HEAD_PRECISIONS,
    HeadPrecisionWarning,
    choose_precision,
)
from assisted_backends.model_facts import ModelFacts
from assisted_backends.native import extension
from assisted_backends.options.errors import OptionError
from assisted_backends.quantized.linear import QuantizedLinear, quantize_model
from assisted_backends.startup.flags import HEAD_PRECISIONS as CLI_CHOICES
from assisted_backends.train_draft import batches, ttt
from assisted_backends.train_draft.data import featurize

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not extension.available(), reason="the package's kernels do not run here"),
]
NEW = 32


@cache
def int4_target():
    """The demo target with its linear layers and embedding int4 on the package's kernels: loaded afresh, not
    copied from `demo_target()`, which a backend may have rewritten in place (IPEX, where it is on)."""
    from assisted_backends.loading.models import load_model

    return quantize_model(load_model(DEMO_DIR / "target", precision="fp32"), "int4")


def _head(precision: str):
    head = copy.deepcopy(demo_head())
    head.precision = precision
    return head


def _prompt(seed: int) -> torch.Tensor:
    return torch.tensor(demo_prompts(1, 30, seed=seed))


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("target_kind", ["float", "int4"])
def test_greedy_output_is_the_targets_with_a_quantized_head(precision, target_kind):
    target = demo_target()[0] if target_kind == "float" else int4_target()
    head = _head(precision)
    assert head_precision(head, target).name == precision
    drafted = accepted = 0
    for seed in (11, 12):
        prompt = _prompt(seed)
        plain = reference_greedy(target, prompt, NEW) if target_kind == "float" else None
        if plain is None:  # a quantized target's reference: its own plain decoding through the package
            plain = generate(target, prompt, max_new_tokens=NEW).sequences
        result = generate(target, prompt, assistant_model=head, max_new_tokens=NEW, num_assistant_tokens=3)
        assert torch.equal(result.sequences, plain)
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert drafted > 0 and accepted > 0  # the acceptance and rollback paths ran with the quantized head


def test_auto_quantizes_the_head_only_next_to_a_target_on_the_kernels():
    head = demo_head()
    float_target, quantized_target = demo_target()[0], int4_target()
    assert head_precision(head, float_target).name == "float"
    choice = head_precision(head, quantized_target)
    assert choice.name == AUTO_SCHEME and "block kernels" in choice.reason
    prepared = prepared_head(head, quantized_target, choice)
    assert all(isinstance(prepared.get_submodule(name), QuantizedLinear) for name in LINEAR_LAYERS)
    assert prepared.compute_dtype == torch.float32
    assert prepared_head(head, quantized_target, choice) is prepared  # cached per head
    assert prepared_head(head, float_target) is head  # already in the target's dtype


def _teacher_forced_drafts(head, target, steps: int = 3) -> torch.Tensor:
    """The head's greedy draft tokens [steps, positions] on the target's continuations of held-out windows,
    teacher-forced as training-time test runs it (the drafts a chain makes while its earlier drafts are right)."""
    prompts = torch.tensor(demo_prompts(8, 24, seed=5))
    with torch.inference_mode():
        full = target.generate(prompts, max_new_tokens=24, min_new_tokens=24, do_sample=False, eos_token_id=None,
                               pad_token_id=1)  # fmt: skip
    examples = featurize(target, LayerTap(target, head.config.layers_for(6)), full.tolist(), [24] * 8, top_k=4)
    batch = batches.collate(examples, batches.vocabulary_lookup(head.t2d), torch.device("cpu"), torch.float32)
    positions = torch.arange(batch.tokens.shape[1])[None].expand(batch.tokens.shape[0], -1)
    attention = ttt.StepAttention(positions < batch.lengths[:, None])
    drafts = []
    with torch.inference_mode():
        hidden = head.fuse(batch.features)
        for k in range(steps):
            hidden = head(ttt._shift(batch.tokens, 1 + k, 0), hidden, positions + k, attention)
            drafts.append(head.draft_logits(hidden).argmax(-1)[positions + 1 + k < batch.lengths[:, None]])
    return torch.cat(drafts)


# Measured on the trained demo head (AMD EPYC, AVX-512 VNNI): int8 agrees with the float head on 99.6% of the
# teacher-forced draft tokens (3 chain steps), int4 on 93.8%; the floors leave room for other CPUs' last bits.
AGREEMENT_FLOOR = {"int8": 0.97, "int4": 0.85}


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_the_quantized_heads_drafts_mostly_agree_with_the_float_heads(scheme):
    target, _ = demo_target()
    head = demo_head()
    float_drafts = _teacher_forced_drafts(prepared_head(head, target), target)
    quantized = prepared_head(head, target, choose_precision(scheme, frozenset(), torch.device("cpu")))
    agreement = (float_drafts == _teacher_forced_drafts(quantized, target)).float().mean().item()
    head.use_target_embedding(None)
    assert agreement >= AGREEMENT_FLOOR[scheme], f"{scheme}: {agreement:.3f} of the float head's drafts"


def test_cost_prior_counts_the_bytes_the_head_reads():
    head = demo_head()
    float_target, quantized_target = demo_target()[0], int4_target()
    float_facts, quantized_facts = ModelFacts.of(float_target), ModelFacts.of(quantized_target)
    assert quantized_facts.weight_bytes < float_facts.weight_bytes / 5  # int4 blocks: ~0.6 bytes a weight
    body = head.body_parameters()
    assert draft_costs(head, float_facts)["cost_ratio"] == pytest.approx(body * 4 / float_facts.weight_bytes)
    quantized = prepared_head(head, quantized_target)
    assert draft_costs(head, quantized_facts)["cost_ratio"] == step_bytes(quantized) / quantized_facts.weight_bytes
    assert step_bytes(quantized) < body * 4 / 3  # int8 blocks: 34 bytes per 32 weights
    int4_head, _ = quantized_copy(head, "int4")
    assert step_bytes(int4_head) < step_bytes(quantized) * 0.65
    bf16 = _head("bf16")
    assert draft_costs(bf16, float_facts)["cost_ratio"] == pytest.approx(body * 2 / float_facts.weight_bytes)


def test_a_bad_value_is_refused_by_name(tmp_path):
    head = _head("auto")
    with pytest.raises(OptionError, match=r"head_precision='int3' must be one of 'auto', 'float', 'bf16'"):
        head.precision = "int3"
    save_head(demo_head(), tmp_path, "specforge", target_layers=6)
    with pytest.raises(OptionError, match="head_precision='fp8'"):
        load_head(tmp_path, precision="fp8")
    assert load_head(tmp_path, precision="int4").precision == "int4"
    assert CLI_CHOICES == HEAD_PRECISIONS
    assert build_parser(["auto", "cpu"]).parse_args(["--head-precision", "int8"]).head_precision == "int8"


def test_without_the_kernels_a_quantized_head_falls_back_to_float(monkeypatch):
    monkeypatch.setenv(extension.SWITCH_VARIABLE, "aten")
    choice = choose_precision("int4", frozenset({"blocks"}), torch.device("cpu"))
    assert choice.name == "float" and choice.fell_back and "ASSISTED_BACKENDS_KERNELS=aten" in choice.reason
    assert choose_precision("auto", frozenset({"blocks"}), torch.device("cpu")).name == "float"
    target, _ = demo_target()
    prompt = _prompt(13)
    with pytest.warns(HeadPrecisionWarning, match=r"head_precision='int8': int8 not possible: .*KERNELS=aten"):
        result = generate(target, prompt, assistant_model=_head("int8"), max_new_tokens=NEW, num_assistant_tokens=3)
    assert torch.equal(result.sequences, reference_greedy(target, prompt, NEW))

"""Conformance of the HPU backend against a recording FAKE of habana_frameworks (no Gaudi here).

`CPUPlacedHPUBackend` is the real HPUBackend with tensors left on the CPU, so whole generations run
through its code while every vendor call lands in the fake (tests/fakes/habana_fake.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from fakes import habana_fake
from tiny_models import noisy_copy, random_prompt, reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.backends import BackendOptions, DeviceUnavailableError, registry, resolve_backend
from assisted_backends.backends.cpu.backend import CPUBackend
from assisted_backends.backends.hpu import optimum_habana
from assisted_backends.backends.hpu.backend import HPUBackend, execution_mode

BUCKET = 16
GAMMA = 3


class CPUPlacedHPUBackend(HPUBackend):
    """HPUBackend whose tensors stay on the CPU; everything else (vendor calls included) unchanged."""

    device_type = "cpu"


@pytest.fixture
def fake():
    registry.discover.cache_clear()
    recording = habana_fake.install()
    yield recording
    habana_fake.uninstall()
    registry.discover.cache_clear()


@pytest.fixture
def lazy(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")


def fresh_pair():
    """prepare() converts models in place, so each test gets its own."""
    target = tiny_model("llama", seed=0)
    return target, noisy_copy(target, seed=3, scale=0.05)


def run(backend, target, draft, prompt_length=6, max_new_tokens=20, **kwargs):
    return generate(
        target,
        random_prompt(prompt_length, seed=prompt_length),
        assistant_model=draft,
        max_new_tokens=max_new_tokens,
        num_assistant_tokens=GAMMA,
        backend=backend,
        **kwargs,
    )


def test_padding_policy_is_the_cpu_static_shape_policy():
    options = BackendOptions(bucket_size=BUCKET)
    cpu_static = CPUBackend(options).padding(True)
    assert HPUBackend(options).padding(False) == cpu_static  # static shapes even when not asked for
    assert HPUBackend(options).padding(True) == cpu_static
    assert cpu_static.static_shapes and cpu_static.bucket == BUCKET
    assert HPUBackend().padding(False).bucket == 128
    assert HPUBackend().cache_layout() == "static"


def test_lazy_mode_marks_every_step_and_wraps_both_models(fake, lazy):
    target, draft = fresh_pair()
    expected = reference_greedy(target, random_prompt(6, seed=6), 20)
    backend = CPUPlacedHPUBackend(BackendOptions(dtype="fp32", bucket_size=BUCKET))
    result = run(backend, target, draft)

    assert torch.equal(result.sequences, expected)
    stats = result.stats
    assert stats.cache_layout == "static" and stats.drafted == GAMMA * stats.rounds  # draft always γ
    assert fake.count("mark_step") == stats.target_forwards + stats.draft_forwards
    assert [id(m) for m in fake.wrapped] == [id(target), id(draft)]
    assert fake.count("synchronize") >= 2  # after prefill and at the end, so timings are honest
    for model in (target, draft):
        assert fake.bypassed[id(model)] == 1  # the bucket-sized prefill runs outside graphs
        assert fake.replays[id(model)] > 0


def test_prepare_is_idempotent_and_drops_graphs_of_the_previous_generation(fake, lazy):
    target, draft = fresh_pair()
    backend = CPUPlacedHPUBackend(BackendOptions(dtype="fp32", bucket_size=BUCKET))
    first = run(backend, target, draft)
    second = run(backend, target, draft)
    assert torch.equal(first.sequences, second.sequences)
    assert fake.count("wrap_in_hpu_graph") == 2  # once per model, not once per generation
    assert fake.count("clear_cache") == 2  # second generation: one per model
    assert backend.prepare(target, "target") is target


def test_bf16_by_default_and_draft_precision_honoured(fake, lazy):
    target, draft = fresh_pair()
    backend = CPUPlacedHPUBackend(BackendOptions(bucket_size=BUCKET, draft_precision="fp32"))
    run(backend, target, draft, max_new_tokens=6)
    assert next(target.parameters()).dtype == torch.bfloat16
    assert next(draft.parameters()).dtype == torch.float32
    assert backend.describe()["dtype"] == "bfloat16"


def test_graphs_off_still_marks_steps_but_wraps_nothing(fake, lazy):
    target, draft = fresh_pair()
    backend = CPUPlacedHPUBackend(BackendOptions(dtype="fp32", bucket_size=BUCKET, graphs=False))
    result = run(backend, target, draft, max_new_tokens=8)
    assert fake.count("wrap_in_hpu_graph") == 0
    assert fake.count("mark_step") == result.stats.target_forwards + result.stats.draft_forwards


def test_eager_mode_compiles_with_hpu_backend_and_never_marks_steps(fake, eager):
    target, draft = fresh_pair()
    expected = reference_greedy(target, random_prompt(6, seed=6), 6)
    backend = CPUPlacedHPUBackend(BackendOptions(dtype="fp32", bucket_size=BUCKET))
    result = run(backend, target, draft, max_new_tokens=6)
    assert torch.equal(result.sequences, expected)
    assert fake.count("mark_step") == 0 and fake.count("wrap_in_hpu_graph") == 0
    assert fake.compiled_graphs > 0  # dynamo handed graphs to the "hpu_backend" compiler
    assert backend.describe()["graphs"] == "torch.compile(backend='hpu_backend')"


def test_seeding_and_memory_statistics_go_through_habana(fake, lazy):
    backend = CPUPlacedHPUBackend()
    assert backend.generator(7) is None and fake.seeds == [7]
    assert backend.memory_stats() == {"memory_allocated_bytes": 1024, "max_memory_allocated_bytes": 2048}


def test_lazy_mode_default_asks_habana_when_the_variable_is_unset(fake, monkeypatch):
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    fake.lazy = False
    assert execution_mode() == "eager"
    fake.lazy = True
    assert execution_mode() == "lazy"
    with pytest.raises(ValueError, match="PT_HPU_LAZY_MODE='yes' must be '0'"):
        execution_mode({"PT_HPU_LAZY_MODE": "yes"})


def test_other_devices_never_import_habana(fake):
    target, draft = fresh_pair()
    generate(target, random_prompt(5, seed=5), assistant_model=draft, max_new_tokens=5, device="cpu")
    generate(
        target, random_prompt(5, seed=5), assistant_model=draft, max_new_tokens=5, static_shapes=True, device="cpu"
    )
    resolve_backend("cpu").prepare(draft, "draft")
    assert fake.imports == [] and fake.calls == []


def test_auto_picks_hpu_when_habana_sees_a_device(fake):
    assert isinstance(resolve_backend("auto"), HPUBackend)
    fake.device_present = False
    registry.discover.cache_clear()
    assert resolve_backend("auto").name != "hpu"
    with pytest.raises(DeviceUnavailableError, match="sees no Gaudi device"):
        resolve_backend("hpu")


def test_missing_habana_names_the_extra_to_install():
    registry.discover.cache_clear()
    with pytest.raises(DeviceUnavailableError, match=r'pip install -e "\.\[gaudi\]"'):
        resolve_backend("hpu")


def test_bad_precision_names_the_argument():
    with pytest.raises(ValueError, match="dtype='int4' is not supported on hpu; choose one of: auto, fp32, bf16, fp16"):
        HPUBackend(BackendOptions(dtype="int4"))
    with pytest.raises(ValueError, match="draft_precision='w8af32' is a CPU scheme"):
        HPUBackend(BackendOptions(draft_precision="w8af32"))


def test_a_cpu_run_in_a_fresh_process_leaves_habana_unimported():
    code = (
        "import sys, torch, assisted_backends\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "m = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,"
        " num_attention_heads=2, num_key_value_heads=1)).eval()\n"
        "assisted_backends.generate(m, torch.tensor([[1, 2, 3]]), assistant_model=m, max_new_tokens=4,"
        " device='cpu', static_shapes=True)\n"
        "sys.exit(1 if any(n.startswith('habana_frameworks') for n in sys.modules) else 0)\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr[-2000:]


# ---------------------------------------------------------------- optimum-habana (FAKE optimum.habana)


@pytest.fixture
def optimum(fake, monkeypatch):
    monkeypatch.setattr(optimum_habana, "_ADAPTED", [])  # adapt_transformers_to_gaudi runs once per process
    monkeypatch.setenv(optimum_habana.ENV, "on")
    recording = habana_fake.install_optimum()
    yield recording
    habana_fake.uninstall_optimum()


def gaudi_pair(optimum):
    """A pair as from_pretrained returns it after adapt_transformers_to_gaudi(): optimum-habana's classes."""
    target, draft = fresh_pair()
    for model in (target, draft):
        model.__class__ = optimum.gaudi_class(type(model))
    return target, draft


def test_optimum_habana_adapts_once_and_passes_its_forward_options(optimum, lazy):
    backend = CPUPlacedHPUBackend(BackendOptions(dtype="fp32", bucket_size=BUCKET))
    CPUPlacedHPUBackend(BackendOptions(dtype="fp32", bucket_size=BUCKET))
    assert optimum.adapted == 1 and "optimum.habana.transformers.modeling_utils" in optimum.imports
    target, draft = gaudi_pair(optimum)
    expected = reference_greedy(fresh_pair()[0], random_prompt(6, seed=6), 20)
    result = run(backend, target, draft)
    assert torch.equal(result.sequences, expected)
    calls = result.stats.target_forwards + result.stats.draft_forwards
    assert optimum.forward_options == [{"lazy_mode": True, "attn_softmax_bf16": False, "reuse_cache": False}] * calls
    assert optimum.tuple_caches == calls  # optimum-habana 1.21's Gaudi models take tuple caches only
    described = backend.describe()
    assert described["modeling"] == "optimum-habana 1.21.2 (adapt_transformers_to_gaudi)"
    assert (
        described["target_class"]
        == "GaudiLlamaForCausalLM (lazy_mode=True, attn_softmax_bf16=False, reuse_cache=False)"
    )


def test_optimum_habana_in_bf16_eager_mode(optimum, eager):
    target, draft = gaudi_pair(optimum)
    backend = CPUPlacedHPUBackend(BackendOptions(bucket_size=BUCKET, graphs=False))
    run(backend, target, draft, max_new_tokens=4)
    assert optimum.forward_options and all(
        options == {"lazy_mode": False, "attn_softmax_bf16": True, "reuse_cache": False}
        for options in optimum.forward_options
    )


def test_models_loaded_before_the_backend_keep_transformers_modeling_and_say_so(optimum, lazy):
    target, draft = fresh_pair()
    backend = CPUPlacedHPUBackend(BackendOptions(dtype="fp32", bucket_size=BUCKET))
    result = run(backend, target, draft, max_new_tokens=6)
    assert torch.equal(result.sequences, reference_greedy(fresh_pair()[0], random_prompt(6, seed=6), 6))
    assert optimum.forward_options == []  # a transformers forward would reject the Gaudi options
    assert "loaded before the hpu backend was created" in backend.describe()["target_class"]


def test_by_default_a_supported_optimum_habana_is_reported_not_used(optimum, monkeypatch):
    monkeypatch.delenv(optimum_habana.ENV)
    backend = HPUBackend()
    assert optimum.adapted == 0
    assert backend.describe()["modeling"] == (
        f"transformers (optimum-habana 1.21.2 is installed; {optimum_habana.ENV}=on uses its modeling)"
    )


def test_unsupported_optimum_habana_versions_keep_todays_path_or_fail_when_required(optimum, monkeypatch):
    monkeypatch.delenv(optimum_habana.ENV)
    optimum.version = "1.19.0"
    backend = HPUBackend()
    assert optimum.adapted == 0
    assert backend.describe()["modeling"] == (
        "transformers (optimum-habana 1.19.0 is installed; supported is optimum-habana 1.21.x "
        "(>=1.21.0,<1.22; it pins transformers 4.55): using transformers modeling)"
    )
    monkeypatch.setenv(optimum_habana.ENV, "on")
    with pytest.raises(NotImplementedError, match="supported is optimum-habana 1.21.x"):
        HPUBackend()


def test_without_optimum_habana_todays_path_stays(fake, monkeypatch):
    monkeypatch.delenv(optimum_habana.ENV, raising=False)
    assert HPUBackend().describe()["modeling"] == "transformers (optimum-habana not installed)"
    monkeypatch.setenv(optimum_habana.ENV, "on")
    with pytest.raises(ImportError, match="pip install 'optimum-habana>=1.21,<1.22'"):
        HPUBackend()
    monkeypatch.setenv(optimum_habana.ENV, "maybe")
    with pytest.raises(ValueError, match="must be 'auto', 'on' or 'off'"):
        HPUBackend()


def test_optimum_habana_can_be_switched_off(optimum, monkeypatch):
    monkeypatch.setenv(optimum_habana.ENV, "off")
    assert HPUBackend().describe()["modeling"] == f"transformers ({optimum_habana.ENV}=off)"
    assert optimum.adapted == 0 and optimum.imports == []

"""intel-extension-for-pytorch: used where it loads, never required, clear errors when forced.

The tests that need IPEX itself run in the IPEX lane (.ci/lanes/ipex.sh: torch 2.8 + IPEX 2.8 +
transformers 4.51.3), which sets ASSISTED_BACKENDS_EXPECT_IPEX=1 so that they cannot skip there.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from tiny_models import ARCHITECTURES, noisy_copy, random_prompt, reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu import ipex
from assisted_backends.backends.cpu.backend import CPUBackend

LOADABLE = ipex.status().loadable
needs_ipex = pytest.mark.skipif(not LOADABLE, reason=f"IPEX cannot load here: {ipex.status().reason}")


@pytest.fixture(autouse=True)
def _cpu_with_bf16(tmp_path, monkeypatch):
    path = tmp_path / "cpuinfo"
    path.write_text("model name\t: Fake Xeon\nflags\t\t: avx512f avx512_bf16 avx512_vnni amx_bf16 amx_int8\n")
    monkeypatch.setenv("ASSISTED_BACKENDS_CPUINFO", str(path))


def test_ipex_loads_in_the_ipex_lane():
    if os.environ.get("ASSISTED_BACKENDS_EXPECT_IPEX") != "1":
        pytest.skip("only the IPEX lane expects IPEX")
    assert LOADABLE, ipex.status().reason


def test_mode_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(ipex.ENV, raising=False)
    assert ipex.requested_mode() == "auto"
    monkeypatch.setenv(ipex.ENV, "OFF")
    assert ipex.requested_mode() == "off"
    monkeypatch.setenv(ipex.ENV, "sometimes")
    with pytest.raises(ValueError, match="ASSISTED_BACKENDS_IPEX='sometimes' is not one of"):
        ipex.requested_mode()


def test_not_installed_is_reported_without_importing(monkeypatch):
    monkeypatch.setattr(ipex.importlib.util, "find_spec", lambda name: None)
    current = ipex.status()
    assert not current.loadable and "not installed" in current.reason


def test_torch_mismatch_is_detected_from_metadata(monkeypatch):
    monkeypatch.setattr(ipex.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(ipex.importlib.metadata, "version", lambda name: "2.8.0+cpu")
    monkeypatch.setattr(ipex.torch, "__version__", "2.13.0+cpu")
    current = ipex.status()
    assert not current.loadable and "only loads into torch 2.8.x" in current.reason


def test_forced_but_absent_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ipex.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv(ipex.ENV, "on")
    with pytest.raises(ipex.IpexUnavailableError, match="ASSISTED_BACKENDS_IPEX=on asks for.*not installed"):
        CPUBackend(BackendOptions(dtype="bf16"))
    with pytest.raises(ipex.IpexUnavailableError):
        generate(tiny_model("llama", seed=0), random_prompt(3, 0), max_new_tokens=2, device="cpu")


def test_absent_in_auto_mode_runs_natively(monkeypatch):
    monkeypatch.setattr(ipex.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv(ipex.ENV, "auto")
    target = tiny_model("llama", seed=0)
    backend = CPUBackend(BackendOptions(dtype="bf16"))
    generate(target, random_prompt(3, 0), max_new_tokens=3, backend=backend)
    report = backend.describe()
    assert report["ipex_target"].startswith("not used") and "not installed" in report["ipex"]


def test_off_never_imports_it(monkeypatch):
    monkeypatch.setenv(ipex.ENV, "off")
    already = ipex.MODULE in sys.modules
    backend = CPUBackend(BackendOptions(dtype="bf16"))
    generate(tiny_model("llama", seed=0), random_prompt(3, 0), max_new_tokens=3, backend=backend)
    assert backend.describe()["ipex_target"] == f"not used: {ipex.ENV}=off"
    assert already or ipex.MODULE not in sys.modules


def test_auto_uses_it_for_bf16_only():
    loadable = ipex.IpexStatus(True, "2.8.0", "matches")
    assert ipex.wanted("auto", torch.bfloat16, loadable)[0]
    assert not ipex.wanted("auto", torch.float32, loadable)[0]
    assert ipex.wanted("on", torch.float32, loadable)[0]
    assert not ipex.wanted("off", torch.bfloat16, loadable)[0]


def _ipex_modules(model: torch.nn.Module) -> list[str]:
    return [type(m).__module__ for m in model.modules() if type(m).__module__.startswith(ipex.MODULE)]


@needs_ipex
@pytest.mark.parametrize("layout", ["dynamic", "static"])
@pytest.mark.parametrize("draft_precision", ["bf16", "w8af32"])
def test_ipex_bf16_target_assisted_equals_alone(monkeypatch, layout, draft_precision):
    monkeypatch.setenv(ipex.ENV, "auto")
    target = tiny_model("llama", seed=0)
    draft = noisy_copy(tiny_model("llama", seed=0), seed=3, scale=0.02)
    backend = CPUBackend(BackendOptions(dtype="bf16", draft_precision=draft_precision))
    prompt = random_prompt(9, seed=9)
    alone = generate(target, prompt, max_new_tokens=21, cache_layout=layout, backend=backend)
    assisted = generate(
        target,
        prompt,
        assistant_model=draft,
        max_new_tokens=21,
        num_assistant_tokens=3,
        cache_layout=layout,
        backend=backend,
    )
    assert _ipex_modules(target), "ipex.optimize did not rewrite the target"
    assert backend.describe()["ipex_target"].startswith("used")
    assert torch.equal(assisted.sequences, alone.sequences)
    assert 0 < assisted.stats.acceptance_rate < 1  # rollback happened and stayed exact


@needs_ipex
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_ipex_forced_on_fp32_matches_the_native_reference(monkeypatch, arch):
    monkeypatch.setenv(ipex.ENV, "on")
    target = tiny_model(arch, seed=0)
    draft = noisy_copy(target, seed=3, scale=0.02)
    prompt = random_prompt(6, seed=6)
    reference = reference_greedy(target, prompt, 17)  # before IPEX rewrites the target
    backend = CPUBackend(BackendOptions(dtype="fp32"))
    result = generate(target, prompt, assistant_model=draft, max_new_tokens=17, num_assistant_tokens=3, backend=backend)
    assert backend.describe()["ipex_target"].startswith("used")
    if arch != "gpt2":  # GPT-2's Conv1D layers and tied head are left to PyTorch by ipex.optimize
        assert _ipex_modules(target)
    assert torch.equal(result.sequences, reference)

"""Precision by CPU capability: detection with the CPU flags faked both ways, and clear refusals."""

import pytest
import torch
from tiny_models import random_prompt, tiny_model

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu import cpu_features, precision
from assisted_backends.backends.cpu.backend import CPUBackend

SAPPHIRE_RAPIDS = "avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 avx512_fp16"
ZEN4 = "avx512f avx512_bf16 avx512_vnni"
SKYLAKE = "avx2 avx512f avx512bw avx512_vnni"  # no bf16 instructions


def fake_cpuinfo(tmp_path, flags: str, name: str = "Fake CPU") -> str:
    path = tmp_path / "cpuinfo"
    block = f"processor\t: 0\nmodel name\t: {name}\nflags\t\t: fpu sse sse2 {flags}\n\n"
    path.write_text(block + block.replace("processor\t: 0", "processor\t: 1"))
    return str(path)


@pytest.fixture
def cpu_flags(tmp_path, monkeypatch):
    """Fake /proc/cpuinfo for everything in the process (detection reads ASSISTED_BACKENDS_CPUINFO)."""

    def use(flags: str, name: str = "Fake CPU") -> None:
        monkeypatch.setenv("ASSISTED_BACKENDS_CPUINFO", fake_cpuinfo(tmp_path, flags, name))

    return use


def test_detect_reads_flags_and_name(tmp_path):
    features = cpu_features.detect(fake_cpuinfo(tmp_path, SAPPHIRE_RAPIDS, "Intel(R) Xeon(R) Platinum 8480+"))
    assert features.has("amx_bf16") and features.has("amx_int8")
    assert features.native_bf16 and features.native_fp16
    assert features.model_name == "Intel(R) Xeon(R) Platinum 8480+"
    assert "amx_bf16" in features.summary() and "AMX" in features.bf16_support()


def test_detect_without_bf16_instructions(tmp_path):
    features = cpu_features.detect(fake_cpuinfo(tmp_path, SKYLAKE))
    assert not features.native_bf16 and features.bf16_support() == ""


def test_detect_falls_back_to_torch_cpuinfo(tmp_path):
    features = cpu_features.detect(str(tmp_path / "missing"))
    assert features.source in ("torch cpuinfo", "nothing readable")


def test_detection_has_no_side_effects(tmp_path):
    import sys

    before = set(sys.modules)
    cpu_features.detect(fake_cpuinfo(tmp_path, ZEN4))
    assert not {m for m in set(sys.modules) - before if "intel_extension" in m}


@pytest.mark.parametrize(
    ("flags", "expected", "phrase"),
    [
        (SAPPHIRE_RAPIDS, torch.bfloat16, "AMX-BF16"),
        (ZEN4, torch.bfloat16, "AVX512-BF16"),
        (SKYLAKE, torch.float32, "no AMX"),
    ],
)
def test_auto_dtype_follows_the_flags(tmp_path, flags, expected, phrase):
    choice = precision.target_choice("auto", cpu_features.detect(fake_cpuinfo(tmp_path, flags)))
    assert choice.dtype == expected and phrase in choice.reason


def test_none_keeps_the_model_dtype(tmp_path):
    choice = precision.target_choice(None, cpu_features.detect(fake_cpuinfo(tmp_path, SAPPHIRE_RAPIDS)))
    assert choice.dtype is None and choice.name == "model"


def test_forced_bf16_refused_where_emulated(tmp_path):
    features = cpu_features.detect(fake_cpuinfo(tmp_path, SKYLAKE))
    with pytest.raises(precision.UnsupportedPrecisionError, match="neither AMX-BF16 nor AVX512-BF16.*dtype='fp32'"):
        precision.target_choice("bf16", features)
    with pytest.raises(precision.UnsupportedPrecisionError, match="draft_precision='bf16'"):
        precision.draft_choice("bf16", precision.target_choice("fp32", features), features)


def test_forced_fp16_needs_fp16_instructions(tmp_path):
    with pytest.raises(precision.UnsupportedPrecisionError, match="AMX-FP16 nor AVX512-FP16"):
        precision.target_choice("fp16", cpu_features.detect(fake_cpuinfo(tmp_path, ZEN4)))
    assert precision.target_choice("fp16", cpu_features.detect(fake_cpuinfo(tmp_path, SAPPHIRE_RAPIDS))).dtype == (
        torch.float16
    )


def test_unknown_precisions_name_the_choices(tmp_path):
    features = cpu_features.detect(fake_cpuinfo(tmp_path, ZEN4))
    with pytest.raises(ValueError, match="dtype='int2' is not one of"):
        precision.target_choice("int2", features)
    with pytest.raises(ValueError, match="draft_precision='fp8' is not one of"):
        precision.draft_choice("fp8", precision.target_choice(None, features), features)
    assert precision.target_choice("int4", features).quantize == "int4"  # weight-only int4 is a choice now


def test_draft_follows_the_target_when_not_given(tmp_path):
    features = cpu_features.detect(fake_cpuinfo(tmp_path, ZEN4))
    assert precision.draft_choice(None, precision.target_choice("auto", features), features).dtype == torch.bfloat16
    assert precision.draft_choice("w8af32", precision.target_choice("auto", features), features).quantize


def test_generate_refuses_forced_bf16_on_a_cpu_without_it(cpu_flags):
    cpu_flags(SKYLAKE)
    with pytest.raises(precision.UnsupportedPrecisionError, match="bf16 would be emulated"):
        generate(tiny_model("llama", seed=0), random_prompt(4, 0), max_new_tokens=2, device="cpu", dtype="bf16")


def test_backend_reports_the_choice_and_why(cpu_flags):
    cpu_flags(SAPPHIRE_RAPIDS, "Intel(R) Xeon(R) Platinum 8480+")
    backend = CPUBackend(BackendOptions(dtype="auto", draft_precision="w8af32"))
    backend.prepare(tiny_model("llama", seed=0), "target")
    backend.prepare(tiny_model("llama", seed=1, hidden=32, layers=1), "draft")
    report = backend.describe()
    assert report["dtype"] == "bf16" and "AMX-BF16" in report["dtype_reason"]
    assert report["draft_precision"].startswith("w8af32")
    assert "Xeon" in report["cpu"] and "amx_bf16" in report["cpu"]
    for key in ("ipex", "torch_threads", "cpu_affinity", "numa_memory_nodes", "omp_num_threads"):
        assert report[key]


def test_backend_reports_fp32_on_a_cpu_without_bf16(cpu_flags):
    cpu_flags(SKYLAKE)
    backend = CPUBackend(BackendOptions(dtype="auto"))
    prepared = backend.prepare(tiny_model("llama", seed=0), "target")
    assert next(prepared.parameters()).dtype == torch.float32
    assert backend.describe()["dtype"] == "fp32" and "no AMX" in backend.describe()["dtype_reason"]

"""The CUDA backend's device-independent decisions: dtype choice, availability, registration (CPU only)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cuda.backend import CUDABackend, choose_dtype
from assisted_backends.backends.registry import DeviceUnavailableError, discover, resolve_backend


@pytest.mark.parametrize(
    ("requested", "bf16", "expected"),
    [
        (None, True, torch.float32),  # keep the model's own dtype
        ("auto", True, torch.bfloat16),
        ("auto", False, torch.float16),  # e.g. V100, T4: no bf16
        ("fp16", True, torch.float16),
        ("fp32", False, torch.float32),
        ("bf16", True, torch.bfloat16),
    ],
)
def test_choose_dtype(requested, bf16, expected):
    assert choose_dtype(requested, torch.float32, bf16, "dtype") is expected


def test_bf16_on_a_gpu_without_it_names_the_fix():
    with pytest.raises(ValueError, match="draft_precision='fp16'"):
        choose_dtype("bf16", torch.float32, False, "draft_precision")


def test_unknown_dtype_names_the_argument_and_the_choices():
    with pytest.raises(ValueError, match=r"dtype='w8af32' is not supported on cuda; choose one of: auto, fp32"):
        choose_dtype("w8af32", torch.float32, True, "dtype")


def test_draft_precision_overrides_the_target_dtype_for_the_draft():
    class NoBF16(CUDABackend):
        def bf16_supported(self) -> bool:
            return False

    model = torch.nn.Linear(2, 2)
    backend = NoBF16(BackendOptions(dtype="auto", draft_precision="fp32"))
    assert backend.dtype_for(model, "target") is torch.float16
    assert backend.dtype_for(model, "draft") is torch.float32


def test_cuda_is_registered_and_its_absence_is_explained():
    assert CUDABackend in discover()["cuda"]
    assert CUDABackend().cache_layout() == "static"
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible; the absence message cannot be checked here")
    with pytest.raises(DeviceUnavailableError, match="device='cuda' is not available: .*(CUDA|GPU)"):
        resolve_backend("cuda")
    assert resolve_backend("auto").name == "cpu"


def test_importing_the_backend_does_not_initialise_cuda():
    code = "import torch, assisted_backends.backends.cuda.backend; print(torch.cuda.is_initialized())"
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert output.strip() == "False"

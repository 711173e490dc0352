"""PyTorch's CPU weight-only kernels: formulas, input constraints, packed layout, batch invariance.

Batch invariance: row m of a call over M rows must equal that row computed alone, bit for bit, for
M = 1..16 (a decode step is M = 1, a verify pass M = γ + 1). Skipped only where the torch build lacks
the kernel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from assisted_backends.quantized import kernels
from assisted_backends.quantized.int4_layout import layout

pytestmark = pytest.mark.usefixtures("one_thread")

AVAILABLE = kernels.available()
needs_int8 = pytest.mark.skipif(not AVAILABLE.int8pack_mm, reason=AVAILABLE.missing("int8") or "int8 kernel")
needs_int4 = pytest.mark.skipif(not AVAILABLE.int4, reason=AVAILABLE.missing("int4") or "int4 kernel")
DTYPES = (torch.bfloat16, torch.float32, torch.float16)
SHAPES = ((1536, 576), (576, 1536))  # SmolLM2's MLP up / down: (N, K)


def _activations(k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(16, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


@needs_int4
@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_dequantization_formula(dtype):
    # w = (q − 8)·s + z, one fp32 fma: the identity input reads single weights back exactly.
    assert kernels.check_int4_formula(dtype) == 0.0


@needs_int8
@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_dequantization_formula(dtype):
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (48, 64), generator=generator, dtype=torch.int8)
    scales = (torch.rand(48, generator=generator) + 0.01).to(dtype)
    extracted = kernels.int8_mm(torch.eye(64, dtype=dtype), codes, scales).t()
    reference = kernels.dequantize_int8(codes, scales).to(dtype)
    assert kernels.same_bits(extracted, reference)


@needs_int4
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", (32, 64))
@pytest.mark.parametrize("shape", SHAPES)
def test_int4_kernel_is_batch_invariant(dtype, group_size, shape):
    n, k = shape
    generator = torch.Generator().manual_seed(2)
    packed = kernels.pack_int4_codes(torch.randint(0, 16, (n, k), generator=generator))
    scale_zeros = (torch.rand(k // group_size, n, 2, generator=generator) * 0.1).to(dtype)
    result = kernels.batch_invariance(
        lambda x: kernels.int4_mm(x, packed, group_size, scale_zeros), _activations(k, dtype)
    )
    assert all(result.values()), (
        f"rows differ from the one-row call for M in {[m for m, ok in result.items() if not ok]}"
    )


@needs_int8
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_int8_kernel_is_batch_invariant(dtype, shape):
    n, k = shape
    generator = torch.Generator().manual_seed(3)
    codes = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
    scales = (torch.rand(n, generator=generator) * 0.01).to(dtype)
    result = kernels.batch_invariance(lambda x: kernels.int8_mm(x, codes, scales), _activations(k, dtype))
    assert all(result.values()), (
        f"rows differ from the one-row call for M in {[m for m, ok in result.items() if not ok]}"
    )


def test_batch_invariance_check_can_fail():
    # A function whose row result depends on M: the check must notice.
    result = kernels.batch_invariance(lambda x: x + x.shape[0], torch.zeros(16, 4))
    assert result[1] and not any(result[m] for m in range(2, 17))


def test_shape_constraints():
    assert kernels.int8_supported(576) and not kernels.int8_supported(40) and not kernels.int8_supported(0)
    assert kernels.int4_supported(1536, 576, 32) and kernels.int4_supported(1536, 576, 64)
    assert not kernels.int4_supported(1536, 576, 128)  # 576 = 4.5 groups of 128
    assert not kernels.int4_supported(40, 576, 32)  # N not a multiple of 16
    assert not kernels.int4_supported(1536, 576, 16)  # the kernel refuses groups of 16


@needs_int4
def test_int4_kernel_refuses_what_the_constraints_refuse():
    codes = torch.randint(0, 16, (40, 64), dtype=torch.int32)
    with pytest.raises(RuntimeError, match="16"):
        kernels.pack_int4_codes(codes)


@needs_int4
@pytest.mark.parametrize("n", (16, 48, 64, 80, 176, 8192 + 64))
def test_int4_layout_reads_rows_back(n):
    k = 64
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(n), dtype=torch.uint8)
    packed = kernels.pack_int4_codes(codes, rows_per_chunk=8192)
    rows = torch.tensor([0, n - 1, n // 2, 15, n - 16])
    assert torch.equal(layout().codes(packed, rows, n, k), codes[rows])


@needs_int4
def test_chunked_packing_equals_one_call():
    codes = torch.randint(0, 16, (8192 * 2 + 128, 32), generator=torch.Generator().manual_seed(5))
    assert torch.equal(kernels.pack_int4_codes(codes, rows_per_chunk=8192), kernels.pack_int4_codes(codes, 1 << 20))


@needs_int4
@pytest.mark.parametrize("capability", ("avx2", "default"))
def test_int4_layout_and_invariance_under_other_capabilities(capability):
    # Other machines dispatch to other micro-kernels (and byte orders); ATen can be told to.
    script = textwrap.dedent(
        """
        import torch
        torch.set_num_threads(1)
        from assisted_backends.quantized import kernels
        from assisted_backends.quantized.int4_layout import layout
        codes = torch.randint(0, 16, (176, 64), dtype=torch.uint8)
        packed = kernels.pack_int4_codes(codes)
        assert torch.equal(layout().codes(packed, torch.arange(176), 176, 64), codes)
        sz = (torch.rand(2, 176, 2) * 0.1).bfloat16()
        x = torch.randn(16, 64).bfloat16()
        assert all(kernels.batch_invariance(lambda a: kernels.int4_mm(a, packed, 32, sz), x).values())
        q8 = torch.randint(-127, 128, (176, 64), dtype=torch.int8)
        s8 = torch.rand(176).bfloat16()
        assert all(kernels.batch_invariance(lambda a: kernels.int8_mm(a, q8, s8), x).values())
        print(torch.backends.cpu.get_cpu_capability(), layout().block_rows)
        """
    )
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    reported = done.stdout.split()[0].lower()
    assert reported == capability or (capability, reported) == ("default", "no")  # torch 2.8 says "NO AVX"

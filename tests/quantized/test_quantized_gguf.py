"""GGUF blocks -> kernel layouts: decoders against gguf.quants, exactness in fp32, bounds in bf16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("gguf", reason="the GGUF tests need the gguf package: pip install gguf")

from quantized_fixtures import random_blocks  # noqa: E402

from assisted_backends.quantized import gguf as blocks  # noqa: E402
from assisted_backends.quantized import kernels  # noqa: E402
from assisted_backends.quantized.packing import Int4Weight, Int8Weight  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not kernels.available().int4, reason=kernels.available().missing("int4") or "int4"),
]
FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
N, K = 48, 512


def _reference(kind: str, data: np.ndarray) -> torch.Tensor:
    return blocks.dequantize_reference(kind, data, (N, K))


@pytest.mark.parametrize("kind", FORMATS)
def test_decoder_matches_gguf_reference(kind):
    data = random_blocks(kind, N, K, seed=1)
    decoded = blocks.block_values(kind, data, (N, K))
    assert torch.equal(decoded.dequantize(), _reference(kind, data))  # value for value (±0 compare equal)


@pytest.mark.parametrize("kind", FORMATS)
def test_fp32_repack_dequantizes_to_gguf_values(kind):
    data = random_blocks(kind, N, K, seed=2)
    weight = blocks.repack(kind, data, (N, K), torch.float32)
    assert isinstance(weight, Int4Weight)
    rows = weight.rows(torch.arange(N))
    assert torch.equal(rows, _reference(kind, data))
    # ...and those are the weights the kernel multiplies by: x = identity reads them back.
    eye = torch.eye(K).repeat(1, weight.planes)
    read = kernels.int4_mm(eye, weight.packed, weight.group_size, weight.scale_zeros).t()
    assert torch.equal(read, rows)


@pytest.mark.parametrize("kind", FORMATS)
def test_bf16_repack_error_is_within_its_bound(kind):
    data = random_blocks(kind, N, K, seed=3)
    weight = blocks.repack(kind, data, (N, K), torch.bfloat16)
    reference = _reference(kind, data)
    error = (weight.rows(torch.arange(N)) - reference).abs()
    bound = blocks.error_bound(blocks.block_values(kind, data, (N, K)), torch.bfloat16)
    assert (error <= bound).all(), f"worst error/bound {(error / bound).max():.3f}"
    assert error.max() > 0  # bf16 scales do round: the bound is being exercised, not vacuous


@pytest.mark.parametrize("kind", ("Q4_0", "Q5_0", "Q8_0", "Q6_K"))
def test_bf16_repack_of_zero_free_formats_is_rounded_scale_times_value(kind):
    # Z = 0: the stored weight is exactly bf16(S)·v; nothing else is rounded.
    data = random_blocks(kind, N, K, seed=4)
    decoded = blocks.block_values(kind, data, (N, K))
    weight = blocks.repack(kind, data, (N, K), torch.bfloat16)
    scale = decoded.scales.to(torch.bfloat16).double().repeat_interleave(decoded.group_size, dim=1)
    assert torch.equal(weight.rows(torch.arange(N)), (scale * decoded.values.double()).float())


def test_error_bound_catches_a_wrong_scale():
    # A bound test that cannot fail proves nothing: perturb one scale by 1% and it must trip.
    data = random_blocks("Q4_1", N, K, seed=5)
    weight = blocks.repack("Q4_1", data, (N, K), torch.bfloat16)
    weight.scale_zeros[0, 0, 0] *= 1.01
    error = (weight.rows(torch.arange(N)) - _reference("Q4_1", data)).abs()
    bound = blocks.error_bound(blocks.block_values("Q4_1", data, (N, K)), torch.bfloat16)
    assert not (error <= bound).all()


def test_row_order_moves_whole_quantized_rows():
    data = random_blocks("Q4_K", N, K, seed=6)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    moved = blocks.repack("Q4_K", data, (N, K), torch.float32, row_order=order)
    assert torch.equal(moved.rows(torch.arange(N)), _reference("Q4_K", data)[order])


def test_unsupported_shapes_fall_to_int8_or_dense():
    assert blocks.kernel_layout("Q4_0", (40, 64)) == "int8"  # N % 16 != 0: no int4 layout
    assert blocks.kernel_layout("Q6_K", (40, 256)) == "int8"
    assert blocks.kernel_layout("F16", (64, 64)) == "dense"
    data = random_blocks("Q4_0", 40, 64, seed=7)
    weight = blocks.repack("Q4_0", data, (40, 64), torch.bfloat16)
    assert isinstance(weight, Int8Weight)
    error = (weight.rows(torch.arange(40)) - blocks.dequantize_reference("Q4_0", data, (40, 64))).abs().amax(dim=1)
    assert (error <= weight.scales.float() / 2 * (1 + 2**-20)).all()


def test_missing_gguf_package_names_the_install_command(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(ImportError, match="pip install gguf"):
        blocks.require_gguf()

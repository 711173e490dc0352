"""Q5_0, Q5_1 and Q5_K in 5 bits and Q6_K in 6 (`blocks`: the nibbles as 4-bit codes store them and a plane of high
bits): the same integers, scales and fp32 operations as the old 8-bit widened layout (`blocks.widened`), so every
output is the same bits, on every instruction-set path this CPU runs, for M = 1..16 and 1 or 2 threads; the reading
back (values, rows) agrees with gguf's dequantization; the cache names the new layout. (The native decoder's reading
of such a token table: tests/native/test_decoder_planes_embedding.py.)"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
from quantized_fixtures import random_blocks

from assisted_backends.native import extension
from assisted_backends.quantized import blocks, gguf

pytest.importorskip("gguf", reason="the block formats come from the gguf package's tables")
ISAS = extension.ISA_NAMES
needs_kernels = pytest.mark.skipif(not extension.available(), reason=extension.status().reason or "no kernels")


PLANES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K")
# format -> (bits, offset, group, sb, bytes a 16-row tile stores per group; the widened layout's)
SHAPES = {"Q5_0": (5, 16, 32, 1, 320, 512), "Q5_1": (5, 0, 32, 1, 320, 512), "Q5_K": (5, 0, 32, 8, 320, 512),
          "Q6_K": (6, 32, 16, 16, 192, 256)}  # fmt: skip


def _weight(kind: str, n: int, k: int, seed: int = 0) -> tuple[blocks.BlockWeight, object]:
    raw = random_blocks(kind, n, k, seed=seed)
    return blocks.from_gguf(kind, raw, (n, k)), raw


@contextlib.contextmanager
def _threads(threads: int, min_bytes: int):
    before = torch.get_num_threads()
    grain = int(torch.ops.assisted_backends.block_min_bytes_per_thread(-1))
    try:
        torch.set_num_threads(threads)
        torch.ops.assisted_backends.block_min_bytes_per_thread(min_bytes)
        yield
    finally:
        torch.set_num_threads(before)
        torch.ops.assisted_backends.block_min_bytes_per_thread(grain)


@pytest.mark.parametrize("kind", PLANES)
def test_stored_with_planes_and_read_back_as_gguf_values(kind):
    bits, offset, group, sb, group_bytes, widened_bytes = SHAPES[kind]
    n, k = 37, 512  # a partial tile
    weight, raw = _weight(kind, n, k, seed=1)
    assert (weight.bits, weight.offset, weight.group, weight.sb) == (bits, offset, group, sb)
    assert weight.codes.shape == (3, k // group, group_bytes)
    assert weight.codes.nbytes / (48 * k) == bits / 8  # the widened layout: 8 bits a weight
    dense = gguf.dequantize_reference(kind, raw, (n, k))
    assert torch.equal(weight.rows(torch.arange(n)), dense)
    old = blocks.widened(weight)
    assert old.bits == 8 and old.codes.shape == (3, k // group, widened_bytes)
    assert torch.equal(old.values(), weight.values())
    assert torch.equal(weight.values(torch.tensor([36, 0, 17])), old.values(torch.tensor([36, 0, 17])))
    values = weight.values()
    assert int(values.min()) == -offset and int(values.max()) == (1 << bits) - 1 - offset  # every bit is read


def test_widened_refuses_a_weight_without_planes():
    weight, _ = _weight("Q4_0", 16, 64)
    with pytest.raises(ValueError, match="widened takes a 5- or 6-bit weight, got 4-bit"):
        blocks.widened(weight)


def test_the_plane_holds_bit_i_of_mask_c_for_byte_i_of_chunk_c():
    # one row (lane 5), one group: q = 16 (fifth bit only) at column 21 = 16 + 4·1 + 1 -> chunk c = 4 + 1, byte
    # i = 4·5 + 1 = 21 -> plane byte 8·5 + 21 // 8 = 42, bit 21 % 8 = 5
    codes = torch.zeros(16, 32, dtype=torch.uint8)
    codes[5, 21] = 16
    weight = blocks.from_parts(codes, torch.ones(16, 1, dtype=torch.float16), None, None, None, 5, 32, 1, 16)
    plane = weight.codes[0, 0, 256:]
    assert weight.codes[0, 0, :256].eq(0).all()
    assert plane.nonzero().flatten().tolist() == [42] and int(plane[42]) == 1 << 5
    values = weight.values()
    assert int(values[5, 21]) == 0 and int((values == -16).sum()) == 16 * 32 - 1


def test_the_pair_plane_holds_bits_2c_of_byte_i_of_half_h():
    # one row (lane 5), groups 0 and 1 of 16 columns: q = 32 (bit 5 only) at column 16 + 4·2 + 1 = 25 -> half h = 1
    # (group 1, the high nibbles), chunk c = 2, byte i = 4·5 + 1 = 21 -> plane byte 64 + 21 = 85, bit 2c + 1 = 5
    codes = torch.zeros(16, 32, dtype=torch.uint8)
    codes[5, 25] = 32
    sc = torch.ones(16, 2, dtype=torch.int8)
    weight = blocks.from_parts(codes, torch.ones(16, 1, dtype=torch.float16), None, sc, None, 6, 16, 2, 32)
    assert weight.codes.shape == (1, 2, 192)
    unit = weight.codes[0].reshape(-1)
    assert unit[:256].eq(0).all()
    assert (unit[256:].nonzero().flatten() + 256).tolist() == [256 + 85] and int(unit[256 + 85]) == 1 << 5
    values = weight.values()
    assert int(values[5, 25]) == 0 and int((values == -32).sum()) == 16 * 32 - 1


@needs_kernels
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("Q5_0", "5-bit codes take the shapes of Q5_0, Q5_1 or Q5_K only"),
        ("Q6_K", "6-bit codes take Q6_K's shape only"),
    ],
)
def test_a_weight_with_planes_of_another_shape_is_a_one_line_error(kind, message):
    weight, _ = _weight(kind, 16, 256)
    x = torch.randn(1, 256)
    zeros = torch.zeros_like(weight.d)
    with pytest.raises(RuntimeError, match=message):
        arguments = (weight.codes, weight.d, zeros, weight.sc, None, None, 16, 256, weight.bits, weight.group,
                     weight.sb, weight.offset, -1)  # fmt: skip
        torch.ops.assisted_backends.block_linear.default(x, *arguments)


@needs_kernels
@pytest.mark.parametrize("kind", PLANES)
@pytest.mark.parametrize("isa", ISAS)
def test_planes_equal_the_widened_layout_bit_for_bit_for_every_m_and_thread_count(isa, kind):
    """The new kind against the 8-bit layout the format had before (`widened`): M = 1..16, one and two threads (the
    grain set so that two threads really take tiles), on each path this CPU runs, and the plain-PyTorch formula."""
    if isa not in extension.runnable_isas():
        pytest.skip(f"this CPU does not run the {isa} path")
    index = ISAS.index(isa)
    weight, _ = _weight(kind, 16 * 127 + 5, 1024, seed=2)  # 128 tiles (the last partial): work for a helper
    old = blocks.widened(weight)
    x = torch.randn(16, 1024, generator=torch.Generator().manual_seed(4))
    x[2] = 0.0
    x[3, :32] = 1e-30
    reference = blocks.reference_linear(weight, x)
    for threads in (1, 2):
        used = set()
        with _threads(threads, min_bytes=1):
            for m in range(1, 17):
                new = weight.matmul(x[:m], index)
                used.add(int(torch.ops.assisted_backends.block_threads_used()))
                assert torch.equal(new, old.matmul(x[:m], index)), (isa, threads, m)
                assert torch.equal(new, reference[:m]), (isa, threads, m)
            deadline = time.monotonic() + 10  # on a busy machine a helper may wake after the caller took every tile
            while threads == 2 and max(used) < 2 and time.monotonic() < deadline:
                assert torch.equal(weight.matmul(x, index), reference), (isa, threads, 16)
                used.add(int(torch.ops.assisted_backends.block_threads_used()))
                assert torch.equal(old.matmul(x, index), reference), (isa, threads, 16)
        assert max(used) == threads, used  # two threads really took tiles in some call


@needs_kernels
@pytest.mark.parametrize("kind", PLANES)
def test_the_environment_variable_path_gives_the_same_bits(monkeypatch, kind):
    weight, _ = _weight(kind, 48, 256, seed=3)
    old = blocks.widened(weight)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(6))
    seen = []
    for isa in extension.runnable_isas():
        monkeypatch.setenv(extension.ISA_VARIABLE, isa)
        seen.append(weight.bind(None)(x))
        assert torch.equal(seen[-1], old.bind(None)(x)), isa
    assert all(torch.equal(out, seen[0]) for out in seen[1:])


def test_the_cache_names_the_layout_with_planes():
    from pathlib import Path

    from assisted_backends.quantized import model

    assert blocks.LAYOUT_VERSION >= 4  # 1-3 stored Q5_0 / Q6_K / Q5_1, Q5_K widened: such entries must not load
    if model._uses_blocks(torch.bfloat16):
        name = model._weights_file(Path("/x"), "file", 32, torch.bfloat16, ()).name
        assert f"blocks{blocks.LAYOUT_VERSION}" in name and "blocks3" not in name

"""The package's own CPU kernels (native/csrc): the formula, batch invariance on every path, the fallback.

Each instruction set this CPU runs is forced in turn (`isa=`, as `ASSISTED_BACKENDS_KERNEL_ISA` does for a
whole model): the narrower paths on a wider CPU (AVX2 on an AVX-512 machine) must give the same bits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from quantized_fixtures import random_blocks

from assisted_backends.native import extension
from assisted_backends.quantized import blocks, gguf, kernels

pytest.importorskip("gguf", reason="the block formats come from the gguf package's tables")
pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not extension.available(), reason=extension.status().reason or "no kernels"),
]
ISAS = extension.ISA_NAMES
SHAPES = {"Q4_0": (40, 512), "Q4_1": (24, 96), "Q4_K": (40, 512), "Q5_0": (33, 256), "Q5_1": (33, 128),
          "Q5_K": (17, 256), "Q8_0": (48, 160), "Q6_K": (40, 512)}  # fmt: skip


def _runnable(isa: str) -> None:
    if isa not in extension.runnable_isas():
        pytest.skip(f"this CPU does not run the {isa} path")


@pytest.fixture(scope="module")
def weights() -> dict[str, tuple[blocks.BlockWeight, torch.Tensor]]:
    """Per format: the weight in the kernels' layout and gguf's own dequantization of the same bytes."""
    out = {}
    for kind, (n, k) in SHAPES.items():
        raw = random_blocks(kind, n, k, seed=n + k)
        out[kind] = (blocks.from_gguf(kind, raw, (n, k)), gguf.dequantize_reference(kind, raw, (n, k)))
    return out


@pytest.mark.parametrize("kind", SHAPES)
def test_rows_read_back_are_gguf_values(weights, kind):
    weight, dense = weights[kind]
    assert torch.equal(weight.rows(torch.arange(weight.out_features)), dense)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", SHAPES)
def test_kernel_equals_the_plain_pytorch_formula_bit_for_bit(weights, kind, isa):
    _runnable(isa)
    weight, dense = weights[kind]
    x = torch.randn(19, weight.in_features, generator=torch.Generator().manual_seed(3))
    x[3] = 0.0  # an all-zero row: d_x = 0
    x[4, :32] = 1e-30  # a block of tiny values
    out = weight.matmul(x, ISAS.index(isa))
    assert torch.equal(out, blocks.reference_linear(weight, x))
    # and the formula is x times the file's weights, up to the int8 rounding of x (about 1 %)
    exact = x @ dense.t()
    assert (out - exact).norm() <= 0.02 * exact.norm()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ("Q4_0", "Q4_K", "Q5_0", "Q8_0", "Q6_K"))
def test_each_row_equals_that_row_alone_for_every_m(weights, kind, isa):
    _runnable(isa)
    weight, _ = weights[kind]
    x = torch.randn(64, weight.in_features, generator=torch.Generator().manual_seed(5))
    result = kernels.batch_invariance(lambda rows: weight.matmul(rows, ISAS.index(isa)), x, max_rows=16)
    assert all(result.values()), f"M with differing rows: {[m for m, ok in result.items() if not ok]}"
    alone = torch.cat([weight.matmul(x[m : m + 1], ISAS.index(isa)) for m in range(64)])
    assert kernels.same_bits(weight.matmul(x, ISAS.index(isa)), alone)  # M = 64 (8 passes of 8 rows)


@pytest.mark.parametrize("isa", ("amx", "amxmodel"))
@pytest.mark.parametrize("kind", SHAPES)
def test_amx_tiles_take_every_row_count(weights, kind, isa):
    """The AMX path with AMX tiles for every pass (by default passes under `block_amx_min_rows` rows run the AVX-512
    tile): each M from 1 to 16 rows in one pass, and 35 (16 + 16 + 3), give the formula's bits."""
    _runnable(isa)
    weight, _ = weights[kind]
    x = torch.randn(35, weight.in_features, generator=torch.Generator().manual_seed(7))
    x[2] = 0.0
    reference = blocks.reference_linear(weight, x)
    set_min_rows = torch.ops.assisted_backends.block_amx_min_rows
    default = int(set_min_rows(-1))
    assert int(set_min_rows(1)) == 1
    try:
        for m in [*range(1, 17), 35]:
            assert torch.equal(weight.matmul(x[:m], ISAS.index(isa)), reference[:m]), (kind, isa, m)
    finally:
        set_min_rows(default)


def test_threads_do_not_change_the_bits():
    # 128 tiles of 4 KB groups: two threads take tiles (the op says how many did), and give the bits of one
    # (every output element is summed by one thread, in one order). tests/native/test_kernel_invariance.py
    # runs it on every path and format.
    import time

    weight = blocks.from_gguf("Q4_K", random_blocks("Q4_K", 2048, 4096, seed=1), (2048, 4096))
    x = torch.randn(7, weight.in_features, generator=torch.Generator().manual_seed(6))
    threads = torch.get_num_threads()
    used = []
    try:
        torch.set_num_threads(1)
        one = weight.matmul(x)
        torch.set_num_threads(2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and 2 not in used:  # a helper may wake late on a busy machine
            assert kernels.same_bits(one, weight.matmul(x))
            used.append(int(torch.ops.assisted_backends.block_threads_used()))
    finally:
        torch.set_num_threads(threads)
    assert 2 in used, used


@pytest.mark.parametrize("bits", (4, 8))
def test_float_weights_quantize_within_half_a_step(bits):
    weight = torch.randn(72, 160, generator=torch.Generator().manual_seed(bits)) * 0.05
    packed = blocks.from_float(weight, bits)
    scales, _ = packed.scales_zeros()
    error = (packed.rows(torch.arange(72)) - weight).abs()
    assert (error <= scales.repeat_interleave(32, dim=1) / 2 * (1 + 1e-3)).all()
    x = torch.randn(5, 160, generator=torch.Generator().manual_seed(0))
    assert torch.equal(packed.matmul(x), blocks.reference_linear(packed, x))


def test_a_forced_instruction_set_must_be_one_the_package_knows(monkeypatch):
    monkeypatch.setenv(extension.ISA_VARIABLE, "avx1024")
    with pytest.raises(ValueError, match=extension.ISA_VARIABLE):
        extension.forced_isa()
    monkeypatch.setenv(extension.ISA_VARIABLE, "avx2")
    assert extension.forced_isa() == ISAS.index("avx2")


def test_torch_compile_treats_the_op_as_one_opaque_call(weights):
    weight, _ = weights["Q4_0"]
    x = torch.randn(3, weight.in_features)
    compiled = torch.compile(lambda rows: weight.matmul(rows) * 2.0, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), weight.matmul(x) * 2.0)


def test_the_report_says_which_kernels_run():
    assert "the package's block kernels" in extension.status().line()
    assert extension.status().isa in ISAS


def test_without_a_compiler_the_aten_path_serves_the_same_model(tmp_path):
    # A fresh cache and no compiler: the package's kernels cannot build, the report says why in one line, and
    # a quantized model still runs (PyTorch's kernels), assisted output equal to its plain decoding.
    script = textwrap.dedent(
        """
        import torch, sys
        sys.path.insert(0, "tests")
        from tiny_models import tiny_model
        from assisted_backends import generate
        from assisted_backends.backends.base import BackendOptions
        from assisted_backends.backends.cpu.backend import CPUBackend
        from assisted_backends.native import extension
        print("STATUS", extension.status().line())
        backend = CPUBackend(BackendOptions(dtype="int4"))
        target = backend.prepare(tiny_model("llama", seed=0), "target")
        prompt = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
        plain = generate(target, prompt, max_new_tokens=12, backend=backend).sequences
        assisted = generate(target, prompt, max_new_tokens=12, backend=backend, assistant_model=target,
                            num_assistant_tokens=3, schedule="constant")
        report = backend.describe()
        print("KERNELS", report["target_kernels"])
        exact = report["target_verify_pass"] == "bit-identical to one-token steps"
        print("SAME", torch.equal(plain, assisted.sequences) or not exact, assisted.stats.drafted > 0)
        """
    )
    env = {**os.environ, "ASSISTED_BACKENDS_CACHE": str(tmp_path), "CXX": str(tmp_path / "no-such-compiler")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert "PyTorch's int4/int8 kernels (no C++ compiler" in lines["STATUS"]
    assert "PyTorch's int4/int8 kernels" in lines["KERNELS"]
    assert lines["SAME"] == "True True"


def test_every_path_gives_a_quantized_model_the_same_tokens(monkeypatch):
    from tiny_models import tiny_model

    from assisted_backends import generate
    from assisted_backends.backends.base import BackendOptions
    from assisted_backends.backends.cpu.backend import CPUBackend

    backend = CPUBackend(BackendOptions(dtype="int4"))
    target = backend.prepare(tiny_model("llama", seed=0), "target")
    report = backend.describe()
    assert report["target_kernels"].startswith("quantized layers: the package's block kernels")
    if report["target_verify_pass"] != "bit-identical to one-token steps":  # an old transformers' attention
        pytest.skip(f"the verify pass is not batch-invariant here: {report['target_verify_pass']}")
    prompt = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    outputs = {}
    for isa in extension.runnable_isas():
        monkeypatch.setenv(extension.ISA_VARIABLE, isa)
        plain = generate(target, prompt, max_new_tokens=10, backend=backend).sequences
        assisted = generate(target, prompt, max_new_tokens=10, backend=backend, assistant_model=target,
                            num_assistant_tokens=4, schedule="constant")  # fmt: skip
        assert torch.equal(assisted.sequences, plain) and assisted.stats.drafted > 0, isa
        outputs[isa] = plain
    first = next(iter(outputs.values()))
    assert all(torch.equal(out, first) for out in outputs.values())


@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_fused_projections_give_the_unfused_logits_bit_for_bit(arch):
    from architectures import build

    from assisted_backends.quantized.fusion import ProjectionSlice, fuse_projections
    from assisted_backends.quantized.linear import quantize_model

    fused = quantize_model(build(arch, seed=0), "int4")
    assert fuse_projections(fused) == fused.config.num_hidden_layers * 2
    separate = quantize_model(build(arch, seed=0), "int4")
    attention = fused.model.layers[0].self_attn
    assert isinstance(attention.q_proj, ProjectionSlice)
    assert isinstance(fused.model.layers[0].mlp.up_proj, ProjectionSlice)
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(fused(ids).logits, separate(ids).logits)


def test_only_siblings_of_one_class_on_block_weights_fuse():
    """`fusion` reads layers by the weight they hold (it imports no layer class): float layers, PyTorch-kernel
    layers and a mix stay as they are; the fused layer is of the siblings' own class."""
    from architectures import build

    from assisted_backends.quantized.fusion import fuse_projections
    from assisted_backends.quantized.linear import QuantizedLinear, quantize_model

    assert fuse_projections(build("llama", seed=0)) == 0
    assert fuse_projections(quantize_model(build("llama", seed=0), "int4", dtype=torch.float32)) == 0
    mixed = quantize_model(build("llama", seed=0), "int4")
    attention = mixed.model.layers[0].self_attn
    attention.k_proj = torch.nn.Linear(attention.k_proj.in_features, attention.k_proj.out_features, bias=False)
    assert fuse_projections(mixed) == 2 * mixed.config.num_hidden_layers - 1
    assert type(attention.k_proj) is torch.nn.Linear and type(attention.q_proj) is QuantizedLinear
    assert type(mixed.model.layers[0].mlp.up_proj.shared.fused) is QuantizedLinear


def _random_layout(generator: torch.Generator) -> dict:
    """Bits, group, super-block, offset and which fields a layout has: any the kernels admit (4 and 8 bits: any
    combination; 5 bits: Q5_0's, Q5_1's and Q5_K's shapes; 6 bits: Q6_K's), chosen by `generator`."""
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=generator))]  # noqa: E731
    bits = pick([4, 5, 6, 8])
    if bits == 5:
        sc, zeros = pick([(False, False), (False, True), (True, True)])  # Q5_0, Q5_1, Q5_K
        return {"bits": 5, "group": 32, "sb": pick([1, 8]) if sc else 1, "sc": sc, "zeros": zeros,
                "offset": 0 if zeros else pick([0, 16])}  # fmt: skip
    if bits == 6:
        return {"bits": 6, "group": 16, "sb": pick([2, 16]), "sc": True, "zeros": False, "offset": pick([0, 32])}
    group = 32 if bits == 4 else pick([16, 32])
    return {"bits": bits, "group": group, "sb": pick([1, 256 // group]), "sc": pick([True, False]),
            "zeros": pick([True, False]), "offset": pick([0, 8]) if bits == 4 else 0}  # fmt: skip


@pytest.mark.parametrize("seed", range(24))
def test_random_layouts_match_the_formula_on_every_path(seed):
    # A seeded differential fuzzer over what the layouts allow: any stored code (8-bit v = −128 included), 4, 5, 6
    # or 8 bits, group 16 or 32, super-blocks, offsets, with or without per-group multipliers and zeros, any N, M.
    generator = torch.Generator().manual_seed(seed)
    layout = _random_layout(generator)
    bits, group, sb = layout["bits"], layout["group"], layout["sb"]
    n = int(torch.randint(1, 70, (1,), generator=generator))
    k = group * sb * int(torch.randint(1, 5, (1,), generator=generator))
    k = k if k % 32 == 0 else 2 * k
    groups = k // group
    codes = torch.randint(0, 1 << bits, (n, k), generator=generator).to(torch.uint8)
    half = lambda shape: (torch.rand(shape, generator=generator) * 2e-2 - 1e-2).to(torch.float16)  # noqa: E731
    byte = lambda: torch.randint(-128, 128, (n, groups), generator=generator).to(torch.int8)  # noqa: E731
    with_sc, with_min = layout["sc"], layout["zeros"]
    weight = blocks.from_parts(codes, half((n, groups // sb)), half((n, groups // sb)) if with_min else None,
                               byte() if with_sc else None, byte() if with_sc and with_min else None, bits, group, sb,
                               layout["offset"])  # fmt: skip
    x = torch.randn(int(torch.randint(1, 20, (1,), generator=generator)), k, generator=generator) * 3
    reference = blocks.reference_linear(weight, x)
    for isa in extension.runnable_isas():
        assert torch.equal(weight.matmul(x, ISAS.index(isa)), reference), (isa, layout)
    if bits in (5, 6):  # and the planes give the widened layout's bits
        assert torch.equal(weight.matmul(x), blocks.widened(weight).matmul(x)), layout


def _attention_inputs(seed: int, heads: int = 6, kv_heads: int = 2, rows: int = 7, keys: int = 37, dim: int = 64):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, rows, dim, generator=generator)
    k, v = (torch.randn(2, kv_heads, keys, dim, generator=generator) for _ in range(2))
    mask = torch.rand(2, 1, rows, keys, generator=generator) > 0.2  # padding and windows: any pattern
    lengths = torch.arange(keys - rows + 1, keys + 1)
    return q, k, v, mask, lengths


@pytest.mark.parametrize("dim", (64, 40))
def test_row_attention_is_attention_and_each_row_is_alone(dim):
    q, k, v, mask, lengths = _attention_inputs(0, dim=dim)
    op = torch.ops.assisted_backends.row_attention.default
    out = op(q, k, v, mask, lengths, dim**-0.5, -1)
    attended = mask & (torch.arange(k.shape[2])[None, :] < lengths[:, None])[None, None]
    groups = q.shape[1] // k.shape[1]
    reference = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), attn_mask=attended
    ).transpose(1, 2)
    assert torch.allclose(out, reference, atol=1e-5, rtol=1e-5)
    alone = torch.cat([op(q[:, :, j : j + 1], k, v, mask[:, :, j : j + 1], lengths[j : j + 1], dim**-0.5, -1)
                       for j in range(q.shape[2])], dim=1)  # fmt: skip
    assert kernels.same_bits(alone, out)
    assert kernels.same_bits(op(q, k, v, mask, lengths, dim**-0.5, 0), out)  # the scalar path: the same operations


def test_row_attention_gives_a_row_with_no_keys_zeros():
    q, k, v, mask, lengths = _attention_inputs(1)
    mask[0, :, 2] = False
    out = torch.ops.assisted_backends.row_attention.default(q, k, v, mask, lengths, 0.125, -1)
    assert torch.equal(out[0, 2], torch.zeros_like(out[0, 2])) and torch.isfinite(out).all()


def test_a_dtype_cast_of_the_model_keeps_the_block_scales():
    # `.to(dtype)` / `.float()` on a model casts every float buffer: the fp16 block scales must come back unchanged
    from assisted_backends.quantized.linear import QuantizedLinear

    layer = QuantizedLinear(blocks.from_float(torch.randn(48, 96, generator=torch.Generator().manual_seed(0)), 4))
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(1))
    before = layer(x)
    layer.to(torch.bfloat16).float()
    assert layer.block_d.dtype == torch.float16 and layer.block_dmin.dtype == torch.float16
    assert torch.equal(layer(x), before)  # and the op's bound arguments follow the replaced buffers

"""One weight interface (`quantized.weights.LinearWeight`): every format implements it, `QuantizedLinear` and
`QuantizedEmbedding` only ask it (a new format is a new class: one defined here runs through both layers, a dtype
cast, a deepcopy and the repacked-weights cache), and a layer reads the tensors it holds now."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from assisted_backends.native import extension
from assisted_backends.quantized import blocks, kernels
from assisted_backends.quantized.formats import FORMATS, format_class
from assisted_backends.quantized.linear import QuantizedEmbedding, QuantizedLinear
from assisted_backends.quantized.packing import int4_from_float, int8_from_float
from assisted_backends.quantized.weights import LinearWeight

pytestmark = pytest.mark.usefixtures("one_thread")
N, K = 48, 128


def _float_weight(seed: int = 0) -> torch.Tensor:
    return torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.05


def _weight(name: str) -> LinearWeight:
    if name == "blocks":
        if not extension.available():
            pytest.skip(f"the package's kernels: {extension.status().reason}")
        return blocks.from_float(_float_weight(), 4)
    if not kernels.available().int4 or not kernels.available().int8pack_mm:
        pytest.skip("PyTorch's weight-only kernels")
    return int8_from_float(_float_weight()) if name == "int8" else int4_from_float(_float_weight(), 32)


def _x(rows: int = 5) -> torch.Tensor:
    return torch.randn(rows, K, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_implements_the_interface(name):
    weight = _weight(name)
    assert isinstance(weight, LinearWeight) and format_class(weight.format) is type(weight) and weight.shape == (N, K)
    again = type(weight).from_buffers(weight.buffers(), weight.meta())
    everything = torch.arange(N)
    assert torch.equal(again.rows(everything), weight.rows(everything))
    layer = QuantizedLinear(weight)
    assert type(layer.weight_data) is type(weight) and layer.kernel == weight.kernel
    assert layer.buffer_names() == tuple(weight.buffers())
    assert (layer.scheme, layer.group_size, layer.planes) == (weight.scheme, weight.group_size, weight.planes)
    assert torch.equal(layer.dequantized_weight(), weight.rows(everything))
    x = _x()
    assert torch.equal(layer(x), weight.bind(None)(x))
    if name == "blocks":  # the bound call is the weight's own product
        assert torch.equal(layer(x), weight.matmul(x))
    else:  # PyTorch's kernel on x in the compute dtype, cast back
        rows = x.to(weight.compute_dtype)
        assert torch.equal(layer(x), weight.product(rows).to(x.dtype))
    table = QuantizedEmbedding(layer)
    ids = torch.tensor([[0, 5, 47], [3, 3, 9]])
    assert torch.equal(table(ids), weight.rows(ids.reshape(-1)).view(2, 3, K))
    with pytest.raises(ValueError, match="unknown quantized weight format 'int3'"):
        format_class("int3")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_replaced_or_copied_buffer_is_what_the_layer_reads(name):
    weight = _weight(name)
    layer, x = QuantizedLinear(weight), _x()
    before = layer(x)
    scales = {"blocks": ("block_d", "block_dmin"), "int8": ("scales",), "int4": ("scale_zeros",)}[name]
    twin = copy.deepcopy(layer)
    for scale in scales:  # S and Z times a power of two: the weight, and every product, doubles exactly
        setattr(layer, scale, getattr(layer, scale) * 2)
    assert torch.equal(layer.dequantized_weight(), 2 * twin.dequantized_weight())
    assert torch.equal(layer(x), 2 * before)
    assert torch.equal(twin(x), before)  # the copy holds (and reads) tensors of its own
    for scale in scales:
        getattr(twin, scale).mul_(2)
    assert torch.equal(twin(x), 2 * before)
    layer.to(torch.bfloat16).float()  # a model's dtype cast: the weight's tensors keep theirs
    assert [getattr(layer, scale).dtype for scale in scales] == [getattr(twin, scale).dtype for scale in scales]
    assert torch.equal(layer(x), 2 * before)


@dataclass
class DenseWeight:
    """A format made for this test: W kept in fp32, x Wᵀ + b by torch.nn.functional.linear."""

    format: ClassVar[str] = "dense-test"
    kernel: ClassVar[str] = "aten"
    group_size: ClassVar[int] = 0
    planes: ClassVar[int] = 1
    scheme: ClassVar[str] = "int8"  # what a report would call it; nothing here reads it but the layer's property
    compute_dtype: ClassVar[torch.dtype] = torch.float32

    matrix: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.matrix.shape)

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"dense_matrix": self.matrix}

    def meta(self) -> dict[str, int]:
        return {}

    @classmethod
    def from_buffers(cls, buffers, meta) -> DenseWeight:
        return cls(buffers["dense_matrix"])

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        return self.matrix[index]

    def bind(self, bias):
        return lambda x: torch.nn.functional.linear(x, self.matrix, None if bias is None else bias.to(x.dtype))

    def describe(self) -> str:
        return "fp32, for a test"


def test_a_new_format_is_a_new_class(monkeypatch, tmp_path):
    from assisted_backends.quantized.model import _load_plan, _Plan, _save_plan

    monkeypatch.setitem(FORMATS, DenseWeight.format, DenseWeight)
    matrix, bias, x = _float_weight(3), torch.randn(N), _x()
    weight = DenseWeight(matrix)
    assert isinstance(weight, LinearWeight)
    layer = QuantizedLinear(weight, bias)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, matrix, bias))
    assert "fp32, for a test" in repr(layer) and set(layer.state_dict()) == {"dense_matrix", "bias"}
    assert layer.block_meta is None and layer.kernel == "aten"
    table = QuantizedEmbedding(layer, embed_scale=2.0)
    assert table.dense_matrix is layer.dense_matrix  # one storage
    assert torch.equal(table(torch.tensor([4, 1])), matrix[[4, 1]] * 2.0)
    layer.to(torch.bfloat16)
    assert layer.dense_matrix.dtype == torch.float32 and layer.bias.dtype == torch.bfloat16
    plan = _Plan(linears={"model.proj": weight}, report={"model.proj": "dense-test"})
    _save_plan(tmp_path / "weights.safetensors", plan)
    loaded = _load_plan(tmp_path / "weights.safetensors")
    assert type(loaded.linears["model.proj"]) is DenseWeight
    assert torch.equal(loaded.linears["model.proj"].matrix, matrix)

"""A `.gguf` whose weights hold a NaN, an infinity or a magnitude beyond 2^32 is refused in one line naming the tensor
(`quantized.finite_values`), as llama.cpp validates row data: on such a file a verify pass's masked NaN keys leak into
earlier rows, so assisted decoding could not equal plain decoding (the fuzzer's finding: F32 bytes set to 0x7f / 0xff,
seed 349)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
from quantized_fixtures import write_tiny_llama_gguf  # noqa: E402

import assisted_backends  # noqa: E402
from assisted_backends.quantized.file_checks import GGUFModelError  # noqa: E402
from assisted_backends.quantized.finite_values import check_finite  # noqa: E402
from assisted_backends.quantized.gguf_header import read_header  # noqa: E402


def _poison(path, tensor: str, byte_offset: int, value: bytes) -> None:
    """Write `value` at `byte_offset` into `tensor`'s data (a NaN float, or a NaN fp16 block scale)."""
    info = read_header(path).tensors[tensor]
    with open(path, "r+b") as handle:
        handle.seek(info.offset + byte_offset)
        handle.write(value)


@pytest.mark.parametrize(
    ("kinds", "tensor", "offset", "value", "part"),
    [
        ("F32", "blk.1.attn_q.weight", 40, np.float32(np.nan).tobytes(), "values"),
        ("F32", "blk.0.ffn_down.weight", 0, np.float32(np.inf).tobytes(), "values"),
        ("F32", "blk.1.attn_q.weight", 0, bytes([0x7F]) * 64, "values"),  # 3.4e38, finite: overflows the sums
        ("Q4_0", "blk.0.attn_norm.weight", 4, np.float32(-np.inf).tobytes(), "values"),
        ("Q4_0", "blk.1.ffn_up.weight", 18 * 3, np.float16(np.nan).tobytes(), "block d (scales)"),  # 4th block's d
        ("Q4_K", "blk.0.attn_v.weight", 2, np.float16(np.inf).tobytes(), "block dmin (scales)"),  # a super's dmin
    ],
)
def test_a_non_finite_weight_is_refused_naming_the_tensor(tmp_path, monkeypatch, kinds, tensor, offset, value, part):
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))
    path = write_tiny_llama_gguf(tmp_path / f"poisoned-{kinds}.gguf", kinds)
    assisted_backends.AssistedGenerator(str(path))  # the well-formed file loads (into its own cache entry)
    poisoned = write_tiny_llama_gguf(tmp_path / f"poisoned2-{kinds}.gguf", kinds, seed=1)
    _poison(poisoned, tensor, offset, value)
    with pytest.raises(GGUFModelError) as raised:
        assisted_backends.AssistedGenerator(str(poisoned))
    message = str(raised.value)
    assert "\n" not in message and str(poisoned) in message and tensor in message, message
    assert f"of its {part} are NaN, infinite or beyond ±2^32" in message, message
    assert not any((tmp_path / "cache").rglob("*poisoned2*/*.safetensors")), "a refused file's weights were cached"


def test_finite_weights_pass_and_each_kind_of_part_is_read():
    check_finite("f.gguf", "t", torch.ones(3, 4))
    check_finite("f.gguf", "t", torch.arange(5))  # integer codes are not values to check
    check_finite("f.gguf", "t", torch.tensor([-(2.0**32), 2.0**32, 65504.0]))
    with pytest.raises(GGUFModelError, match=r"f\.gguf: t: 1 of its values are NaN, infinite or beyond"):
        check_finite("f.gguf", "t", torch.tensor([1.0, float("nan")]))
    with pytest.raises(GGUFModelError, match=r"f\.gguf: t: 2 of its values are NaN, infinite or beyond"):
        check_finite("f.gguf", "t", torch.tensor([1.0, 2.0**33, -3.0e38]))

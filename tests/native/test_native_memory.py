"""What a `.gguf` run holds (docs/native.md, "Measured"): the cached weights are read into memory of their own with
the stored bits (no mapping of the file stays resident), the native cache follows the length used, and freed heap
pages go back to the system. The resident figures themselves: `python -m benchmarks.native_step --memory`."""

from __future__ import annotations

import ctypes

import pytest
import torch

from assisted_backends.native.decoder_cache import NativeCache
from assisted_backends.native.heap import trim_heap


def test_cached_tensors_read_back_with_their_bits(tmp_path):
    from safetensors.torch import load_file, save_file

    from assisted_backends.quantized.model import _read_tensors

    generator = torch.Generator().manual_seed(0)
    tensors = {
        "codes": torch.randint(0, 256, (48, 40), generator=generator, dtype=torch.uint8),
        "d": torch.randn(3, 16, generator=generator).half(),
        "sc": torch.randint(-128, 128, (5, 16), generator=generator, dtype=torch.int8),
        "param:norm": torch.randn(7, generator=generator),
        "param:bf16": torch.randn(2, 3, generator=generator).bfloat16(),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "weights.safetensors"
    save_file(tensors, str(path), metadata={"manifest": "{}"})
    metadata, read = _read_tensors(path)
    expected = load_file(str(path))
    assert metadata == {"manifest": "{}"} and set(read) == set(expected)
    for name, tensor in expected.items():
        assert read[name].dtype == tensor.dtype and read[name].shape == tensor.shape, name
        assert torch.equal(read[name].view(-1).view(torch.uint8), tensor.view(-1).view(torch.uint8)), name
    path.write_bytes(path.read_bytes()[:-8])  # a damaged entry is a clear error, not garbage weights
    with pytest.raises(ValueError, match="cut short"):
        _read_tensors(path)


def test_the_dynamic_cache_follows_the_length_used():
    cache = NativeCache(layers=2, kv_heads=1, head_dim=8)
    cache.reserve(1, 10)
    assert cache.capacity == 64
    cache.keys[1][0, 0, 9] = 3.0
    cache.length = 10
    cache.reserve(1, 65)
    assert cache.capacity == 128 and float(cache.keys[1][0, 0, 9, 0]) == 3.0  # grown by doubling, contents kept


def _resident_anon_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:")) / 1024


def test_freed_heap_pages_go_back():
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018
    except AttributeError:
        pytest.skip("not glibc: trim_heap does nothing")
    blocks = [bytearray(b"x" * (64 << 10)) for _ in range(512)]  # 32 MiB of heap blocks, written
    del blocks[::2]  # 16 MiB of holes between kept blocks: free() alone never hands them back
    before = _resident_anon_mib()
    assert trim_heap() is True
    assert before - _resident_anon_mib() >= 8, "trim_heap released less than half of 16 MiB of freed blocks"
    del blocks

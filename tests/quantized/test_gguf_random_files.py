"""The random-weight GGUF writer of `benchmarks.gguf_scaling` (Q4_0 / Q8_0 / Q4_K / the Q4_K_M mix), read back
with gguf's own dequantization: a small shape, no llama.cpp."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")


@pytest.mark.parametrize("quant", ["Q4_0", "Q8_0", "Q4_K"])
def test_random_file_reads_back(tmp_path, monkeypatch, quant) -> None:
    import benchmarks.gguf_scaling as scaling

    # 384 columns: not a multiple of 256, so Q4_K's matrices fall back to Q5_0 except ffn_down (512 columns)
    monkeypatch.setitem(scaling.SHAPES, "tiny", scaling.Shape(384, 512, 2, 3, 1, 300, True))
    path = scaling.write_random_gguf("tiny", quant, tmp_path / f"tiny-{quant}.gguf")
    reader = gguf.GGUFReader(str(path))
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    if quant == "Q4_K":
        assert kinds == {"F32": 5, "Q4_K": 2, "Q5_0": 13}
    else:
        assert kinds == {"F32": 5, quant: 15}
    for tensor in reader.tensors:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(weights).all()
        if tensor.tensor_type.name in ("Q4_0", "Q4_K", "Q5_0"):  # Q8_0's codes are 8-bit: std 0.74 at scale 0.01
            assert 0.02 < float(weights.std()) < 0.1 and abs(float(weights.mean())) < 0.02
    down = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    assert tuple(int(n) for n in down.shape) == (512, 384)  # gguf lists the columns first


def test_q4_k_m_mix_follows_the_recipe(tmp_path, monkeypatch) -> None:
    """Q6_K for the tied head and for attn_v / ffn_down in the last eighth of two layers; rows that do not divide
    into 256 fall back (Q4_K → Q5_0, Q6_K → Q8_0) as llama-quantize does; every block reads back finite."""
    import benchmarks.gguf_scaling as scaling

    monkeypatch.setitem(scaling.SHAPES, "tiny", scaling.Shape(384, 512, 2, 3, 1, 300, True))
    path = scaling.write_random_gguf("tiny", "Q4_K_M", tmp_path / "tiny-Q4_K_M.gguf")
    reader = gguf.GGUFReader(str(path))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["token_embd.weight"] == "Q8_0"  # Q6_K's fallback: 384 columns
    assert kinds["blk.0.ffn_down.weight"] == "Q4_K" and kinds["blk.1.ffn_down.weight"] == "Q6_K"
    assert kinds["blk.0.attn_v.weight"] == "Q5_0" and kinds["blk.1.attn_v.weight"] == "Q8_0"
    assert Counter(kinds.values()) == {"F32": 5, "Q5_0": 11, "Q4_K": 1, "Q6_K": 1, "Q8_0": 2}
    for tensor in reader.tensors:
        assert np.isfinite(gguf.quants.dequantize(tensor.data, tensor.tensor_type)).all()

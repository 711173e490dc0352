"""The two real GGUF files loaded keeping their quantization (the default for a `.gguf`), through the package.

Run by `.ci/lanes/real_models.sh` (ASSISTED_BACKENDS_REAL_MODELS=1); skipped otherwise. Checks: resident
weights within 1.5x the file, cached loads, sensible text, exactness on the quantized path (assisted greedy
output equal to the same quantized model's plain decoding, every drafter the pair allows, batches), the
verify pass computing the one-token steps' logits bit for bit, fp32 compute equal to gguf's own
dequantization up to summation order, and the CLI running a `.gguf` in its own precision by default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from assisted_backends import AssistedGenerator
from assisted_backends.engine.kv_cache import make_layout
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.loading.real_weights import real_model_gguf
from assisted_backends.quantized.model import load_gguf_quantized

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("ASSISTED_BACKENDS_REAL_MODELS") != "1",
        reason="real-model lane only: .ci/lanes/real_models.sh (ASSISTED_BACKENDS_REAL_MODELS=1)",
    ),
    pytest.mark.usefixtures("one_thread"),
]
CASES = {
    "smollm2-135m-instruct": ("The capital of France is", "Paris"),
    "gemma-3-270m": ("def is_prime(n):", "return"),
}
CODE = (
    "def average(values):\n    total = 0\n    for value in values:\n        total = total + value\n"
    "    return total / len(values)\n"
)


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request):
    path = real_model_gguf(request.param)
    return request.param, path, load_gguf_quantized(path)


def test_weights_stay_quantized_and_write_sensible_text(loaded):
    name, path, first = loaded
    assert first.weight_bytes() <= 1.5 * path.stat().st_size
    again = load_gguf_quantized(path)
    assert again.from_cache
    prompt, expected = CASES[name]
    ids = first.tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = first.model.generate(**ids, max_new_tokens=24, do_sample=False)
        assert torch.equal(again.model(ids["input_ids"]).logits, first.model(ids["input_ids"]).logits)
    assert expected in first.tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


def test_assisted_output_equals_the_quantized_models_plain_decoding(loaded):
    name, path, _ = loaded
    generator = AssistedGenerator(str(path), device="cpu")
    tokenizer = load_gguf_quantized(path).tokenizer
    ids = tokenizer(f"Rewrite this function with type hints.\n\n{CODE}\n", return_tensors="pt").input_ids
    plain = generator.generate(ids, max_new_tokens=32).sequences
    report = generator.backend.describe()
    assert report["dtype"].startswith("int4"), report  # the file's precision, as loaded
    assert report["target_verify_pass"] == "bit-identical to one-token steps", report
    for drafting in (dict(prompt_lookup_num_tokens=4), dict(assistant_early_exit=4, num_assistant_tokens=3)):
        result = generator.generate(ids, max_new_tokens=32, **drafting)
        assert torch.equal(result.sequences, plain), drafting
        assert result.stats.drafted > 0
    if name.startswith("smollm2"):  # a batch of two prompts, each row its tokens alone
        tokenizer.padding_side = "left"
        texts = ["The capital of France is", f"Add a docstring:\n{CODE}"]
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        pad = tokenizer.pad_token_id or 0
        rows = generator.generate(
            batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=16, prompt_lookup_num_tokens=4,
            pad_token_id=pad,
        ).sequences  # fmt: skip
        for row, text in enumerate(texts):
            alone = tokenizer(text, return_tensors="pt").input_ids
            expected = generator.generate(alone, max_new_tokens=16).sequences[0, alone.shape[1] :]
            assert torch.equal(rows[row, batch.input_ids.shape[1] :][: expected.shape[0]], expected), row


def test_a_verify_pass_computes_the_steps_logits_bit_for_bit(loaded):
    _, path, _ = loaded
    generator = AssistedGenerator(str(path), device="cpu")
    target = generator.backend.prepare(generator.model, "target")
    prompt, tokens = torch.arange(100, 140)[None], torch.arange(500, 505)[None]
    logits = {}
    for mode in ("steps", "verify"):
        runner = ModelRunner(target, make_layout("dynamic", target, torch.tensor([0]), 64, 16))
        runner.forward(prompt)
        if mode == "steps":
            logits[mode] = torch.cat([runner.forward(tokens[:, i : i + 1]) for i in range(5)], dim=1)
        else:
            logits[mode] = runner.forward(tokens)
    assert torch.equal(logits["steps"], logits["verify"])


def test_fp32_compute_matches_ggufs_own_dequantization(loaded):
    name, path, _ = loaded
    exact = load_gguf_quantized(path, dtype=torch.float32, tokenizer=False)
    dense = load_gguf_quantized(path, scheme="dense", tokenizer=False)
    ids = torch.arange(100, 120)[None]
    with torch.no_grad():
        a, b = exact.model(ids).logits, dense.model(ids).logits
    assert (a - b).abs().max() <= 1e-4 * b.abs().max(), name


def test_the_cli_runs_a_gguf_in_its_own_precision_by_default(tmp_path):
    path = real_model_gguf("smollm2-135m-instruct")
    out = tmp_path / "run.json"
    command = [sys.executable, "-m", "assisted_backends.cli", "-m", str(path), "--prompt-lookup", "4",
               "--max-new-tokens", "16", "--prompt", CODE, "--json", str(out), "--threads", "1"]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(out.read_text())["runtime"]["dtype"].startswith("int4")

"""Fixtures of the command line's tests: no Hub access, and one saved tiny pair (with the odd directories and
files the command's checks are given), built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_fixtures import write_llama_gguf
from tiny_models import tiny_model

from assisted_backends.demo.corpus import read_corpus
from assisted_backends.demo.tokenizer import train_tokenizer


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_llama():
    """(tokenizer, target, draft): a locally trained tokenizer, a tiny Llama target (4 layers, 256 positions) and
    a perturbed copy of it as the draft."""
    tokenizer = train_tokenizer(read_corpus(60_000)[0], 300)
    target = tiny_model("llama", seed=0, vocab=len(tokenizer), init=0.1, layers=4)
    draft = tiny_model("llama", seed=0, vocab=len(tokenizer), init=0.1, layers=4)
    with torch.no_grad():
        for weight in draft.parameters():
            weight.add_(0.02 * weight.std().nan_to_num(0.0) * torch.randn_like(weight))
    return tokenizer, target, draft


@pytest.fixture(scope="session")
def saved_pair(tiny_llama, tmp_path_factory) -> Path:
    """The tiny target and draft and a GPT-2 target, each saved with the tokenizer; beside them an empty
    directory, a config.json without weights and the cpuinfo of an AVX2-only CPU."""
    root = tmp_path_factory.mktemp("models")
    tokenizer, target, draft = tiny_llama
    models = {"target": target, "draft": draft, "gpt2": tiny_model("gpt2", seed=0, vocab=len(tokenizer))}
    for name, model in models.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    (root / "empty").mkdir()
    (root / "no_weights").mkdir()
    (root / "no_weights" / "config.json").write_text((root / "target" / "config.json").read_text())
    (root / "avx2.cpuinfo").write_text("model name\t: Test CPU\nflags\t\t: fpu sse2 avx avx2 fma\n")
    return root


@pytest.fixture(scope="session")
def target_gguf(tiny_llama, saved_pair) -> Path:
    """The tiny target written as `target.gguf` beside `saved_pair`'s directories (skips without `gguf`)."""
    pytest.importorskip("gguf")
    tokenizer, target, _ = tiny_llama
    return write_llama_gguf(target, tokenizer, saved_pair / "target.gguf")


@pytest.fixture
def gguf_file(target_gguf, tmp_path, monkeypatch) -> Path:
    """`target_gguf`, converted into a cache of this test's own."""
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))
    return target_gguf

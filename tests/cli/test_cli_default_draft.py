"""The default draft is never larger than its target: decided from the target's local files
(a `.gguf`'s tensor table, a directory's config.json) before torch loads, in well under a second; the advice is
prompt lookup."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from gguf_fixtures import write_llama_gguf
from tiny_models import tiny_model

from assisted_backends.cli.main import main
from assisted_backends.cli.model_files import estimate_parameters, locate
from assisted_backends.demo.corpus import read_corpus
from assisted_backends.demo.tokenizer import train_tokenizer
from assisted_backends.demo.pair import shipped_pair

LARGER = "is not larger than its family's usual draft PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T (1.1B)"


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    tokenizer = train_tokenizer(read_corpus(60_000)[0], 300)
    model = tiny_model("llama", seed=0, vocab=len(tokenizer), init=0.1)
    path = write_llama_gguf(model, tokenizer, tmp_path_factory.mktemp("gguf") / "small.gguf")
    return path, sum(p.numel() for p in model.parameters())


def test_a_target_smaller_than_its_familys_draft_gets_prompt_lookup_advice_in_under_a_second(small_gguf, capsys):
    path, parameters = small_gguf
    assert locate(str(path), "-m/--model").parameters == parameters  # counted from the tensor table
    began = time.perf_counter()
    assert main(["-m", str(path), "--max-new-tokens", "4"]) == 2
    elapsed = time.perf_counter() - began
    err = capsys.readouterr().err.strip()
    assert LARGER in err and "--prompt-lookup 10" in err and len(err.splitlines()) == 1, err
    assert elapsed < 1.0, f"{elapsed:.2f} s"


def test_the_decision_needs_no_torch(small_gguf):
    path, _ = small_gguf
    code = ("import sys; from assisted_backends.cli.main import main; "
            f"code = main(['-m', {str(path)!r}]); print(code, 'torch' in sys.modules)")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["2", "False"], run.stderr[-2000:]
    assert LARGER in run.stderr


def test_parameters_estimated_from_config_json_match_the_loaded_model():
    pair = shipped_pair()
    for directory in (pair.target_dir, pair.draft_dir):
        from transformers import AutoModelForCausalLM

        counted = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(directory).parameters())
        estimated = estimate_parameters(json.loads((directory / "config.json").read_text()))
        assert abs(estimated - counted) <= 0.01 * counted, (directory, estimated, counted)

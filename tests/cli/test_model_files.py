"""Model arguments that are files: `.gguf` conversion and caching, the API's str/Path models, the CLI's
`-m`/`--assistant-model` on a .gguf, and the one-line errors (missing `gguf`, ambiguous directories)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers

if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (5, 0):
    pytest.skip(  # the IPEX lane runs 4.51: its GGUF tokenizer conversion needs protobuf and a BOS token
        f".gguf loading is tested on transformers 5.x, not {transformers.__version__}", allow_module_level=True
    )

from gguf_fixtures import write_llama_gguf  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

import assisted_backends  # noqa: E402
from assisted_backends.cache_dir import cache_root, file_sha256  # noqa: E402
from assisted_backends.cli import main  # noqa: E402
from assisted_backends.demo.corpus import read_corpus  # noqa: E402
from assisted_backends.demo.tokenizer import train_tokenizer  # noqa: E402
from assisted_backends.loading import files as model_files  # noqa: E402
from assisted_backends.loading import models  # noqa: E402

TEXT = "def add(first, second):\n    return first + second\n\ndef add_three(a, b, c):\n    return"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_pair():
    tokenizer = train_tokenizer(read_corpus(50_000)[0], 300)
    return tiny_model("llama", seed=0, vocab=len(tokenizer), init=0.1), tokenizer


@pytest.fixture
def gguf_file(tiny_pair, tmp_path):
    model, tokenizer = tiny_pair
    folder = tmp_path / "exported"
    folder.mkdir()
    return write_llama_gguf(model, tokenizer, folder / "tiny-llama.gguf")


def _plain(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)


def test_gguf_converts_once_into_the_cache_with_the_same_weights_and_tokenizer(tiny_pair, gguf_file, monkeypatch):
    model, tokenizer = tiny_pair
    folder = model_files.model_dir(gguf_file)
    assert folder.startswith(str(cache_root() / "gguf"))
    assert Path(folder).name == file_sha256(gguf_file)[:16]  # the content names it: a renamed file finds it
    loaded = models.load_model(gguf_file)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert models.load_tokenizer(gguf_file)(TEXT).input_ids == tokenizer(TEXT).input_ids

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again although the cache holds it")

    monkeypatch.setattr(model_files, "convert_gguf", no_conversion)
    monkeypatch.setitem(sys.modules, "gguf", None)  # the cached directory needs no gguf package
    assert model_files.model_dir(gguf_file.parent) == folder  # a directory holding the file: the same


def test_generate_takes_a_gguf_path_and_a_model_directory(tiny_pair, gguf_file, tmp_path):
    model, tokenizer = tiny_pair
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    expected = _plain(model, ids, 12)
    from_file = assisted_backends.generate(gguf_file, ids, prompt_lookup_num_tokens=3, max_new_tokens=12)
    assert torch.equal(from_file.sequences, expected)
    model.save_pretrained(tmp_path / "saved")
    from_dir = assisted_backends.generate(
        str(tmp_path / "saved"), ids, assistant_model=str(gguf_file), num_assistant_tokens=3, max_new_tokens=12
    )
    assert torch.equal(from_dir.sequences, expected) and from_dir.stats.drafter == "draft_model"


def test_cli_takes_a_gguf_file_and_a_directory_holding_one(gguf_file, capsys):
    code = main(
        ["-m", str(gguf_file), "--assistant-model", str(gguf_file.parent), "--dtype", "fp32", "--no-stream"]
        + ["--max-new-tokens", "6", "--num-assistant-tokens", "2", "--prompt", "def add(a, b):"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "6 new tokens" in captured.out + captured.err


def test_missing_gguf_package_is_a_one_line_error_naming_the_install(gguf_file, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(model_files.MissingGGUFError) as raised:
        assisted_backends.generate(str(gguf_file), torch.tensor([[5, 6, 7]]), max_new_tokens=2)
    message = str(raised.value)
    assert "\n" not in message and "pip install gguf accelerate" in message and str(gguf_file) in message
    assert main(["-m", str(gguf_file), "--prompt-lookup", "3", "--prompt", "x"]) == 2
    stderr = capsys.readouterr().err.strip()
    assert "pip install gguf accelerate" in stderr and "-m/--model" in stderr and "Traceback" not in stderr


def test_model_arguments_that_name_nothing_loadable(tmp_path):
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"GGUF")
    (two / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(model_files.ModelFileError, match=r"several \.gguf files \(a\.gguf, b\.gguf\); pass the one"):
        model_files.find_gguf(two, "--assistant-model")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(model_files.ModelFileError, match="has no config.json or .gguf file"):
        model_files.find_gguf(empty)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(model_files.ModelFileError, match=r"is not a \.gguf file"):
        model_files.find_gguf(tmp_path / "weights.bin")
    with pytest.raises(model_files.ModelFileError, match="file .* does not exist"):
        model_files.find_gguf(tmp_path / "missing.gguf")
    assert model_files.find_gguf("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a Hub id: left to transformers
    assert model_files.model_dir("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_saved_directory_beside_a_gguf_file_is_loaded_as_saved(tiny_pair, gguf_file):
    model, _ = tiny_pair
    model.save_pretrained(gguf_file.parent)  # config.json now sits next to the .gguf
    assert model_files.model_dir(gguf_file.parent) == str(gguf_file.parent)
    assert not (cache_root() / "gguf").exists()  # nothing converted

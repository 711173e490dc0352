"""A `.gguf` target is converted once: the command says so before and after the conversion and nothing when
the cache already holds it, and both caches (the converted directory, and the quantized path's repacked
weights) are keyed by the file's content, so a renamed copy finds them instead of converting or repacking
again."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from cli_fixtures import run_cli
from gguf_fixtures import write_llama_gguf
from tiny_models import tiny_model

from assisted_backends.demo.corpus import read_corpus
from assisted_backends.demo.tokenizer import train_tokenizer
from assisted_backends.loading import files


def test_gguf_conversion_says_so_before_and_after(target_gguf, tmp_path):
    argv = ["-m", str(target_gguf), "--prompt-lookup", "4", "--max-new-tokens", "4", "--prompt", "def f():"]
    first = run_cli(*argv, ASSISTED_BACKENDS_CACHE=str(tmp_path))
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    before = next(i for i, line in enumerate(lines) if line.startswith("converting target.gguf ("))
    assert lines[before + 1].startswith("converted target.gguf in "), first.stderr
    again = run_cli(*argv, ASSISTED_BACKENDS_CACHE=str(tmp_path))
    assert again.returncode == 0 and "convert" not in again.stderr, again.stderr


def test_a_renamed_gguf_is_not_converted_again(gguf_file, tmp_path):
    converted = Path(files.model_dir(gguf_file))
    made = (converted / "config.json").stat().st_mtime_ns
    renamed = tmp_path / "elsewhere" / "renamed-copy.gguf"
    renamed.parent.mkdir()
    shutil.copy2(gguf_file, renamed)
    assert Path(files.model_dir(renamed)) == converted
    assert (converted / "config.json").stat().st_mtime_ns == made
    assert len(list((converted.parent).iterdir())) == 2  # the one conversion and the digest index


def test_a_renamed_gguf_keeps_its_repacked_weights(tmp_path):
    """The quantized path's cache (`<stem>-<sha16>`): a renamed copy links to the entry of the first name."""
    pytest.importorskip("gguf")
    from assisted_backends.loading.models import load_model

    tokenizer = train_tokenizer(read_corpus(60_000)[0], 300)
    model = tiny_model("llama", seed=int(time.time()) % 10_000, vocab=len(tokenizer), init=0.1)  # content new here
    first = write_llama_gguf(model, tokenizer, tmp_path / "first-name.gguf")
    load_model(first)
    entry = files.share_quantized_entry(first)
    made = {path.name: path.stat().st_mtime_ns for path in entry.iterdir()}
    renamed = tmp_path / "second-name.gguf"
    shutil.copy2(first, renamed)
    load_model(renamed)
    linked = files.share_quantized_entry(renamed)
    assert linked.is_symlink() and linked.resolve() == entry.resolve()
    assert {path.name: path.stat().st_mtime_ns for path in entry.iterdir()} == made  # nothing repacked
    shutil.rmtree(entry)
    linked.unlink()

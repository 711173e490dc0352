"""No traceback after the work: every output path is proved writable before a model loads,
`--threads` is capped at the usable cores with one warning, a model on the meta device and a truncated `.gguf`
get the package's own one-line errors, and Ctrl-C prints the text generated so far. Also: a renamed `.gguf` finds
its conversion (the cache is keyed by sha256)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_fixtures import interruptible
from gguf_fixtures import write_llama_gguf
from tiny_models import tiny_model

import assisted_backends
from assisted_backends.backends.cpu import affinity
from assisted_backends.cli.main import main
from assisted_backends.demo.corpus import read_corpus
from assisted_backends.demo.tokenizer import train_tokenizer
from assisted_backends.loading import files
from assisted_backends.train_draft.cli import main as train_draft_main

UNWRITABLE = [
    ["--json", "/proc/out.json"],
    ["--json", "/sys/out.json"],
    ["--json", "/proc/self/status"],
    ["--task", "benchmark", "--csv", "/proc/x.csv"],
    ["--task", "benchmark", "--compare", "--json", "/sys/kernel/out.json"],
]


@pytest.mark.parametrize("flags", UNWRITABLE, ids=lambda flags: " ".join(flags))
def test_an_unwritable_output_fails_in_one_line_before_any_model_loads(flags, capsys):
    began = time.perf_counter()
    assert main(flags) == 2
    elapsed = time.perf_counter() - began
    err = capsys.readouterr().err.strip()
    flag, path = flags[-2:]
    assert err.splitlines() == [f"{err}"] and err.startswith(f"error: {flag} {path}: cannot be written")
    assert "choose another path" in err and elapsed < 2.0, (err, elapsed)


def test_train_draft_checks_its_output_directory_before_loading_the_target(capsys, tmp_path):
    for output in ("/proc/run", "/sys/run"):
        assert train_draft_main(["no-such-target", "--text", str(tmp_path), "--output", output]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"train-draft: error: --output {output}: cannot be written"), err
        assert len(err.splitlines()) == 1


def test_threads_above_the_usable_cores_are_capped_with_one_warning(capsys):
    before = torch.get_num_threads()
    try:
        assert main(["--threads", "999", "--no-assisted", "--max-new-tokens", "2", "--prompt", "def f():"]) == 0
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert threads == affinity.usable_cores()
    assert err.lower().count("warning") == 1, err
    assert f"--threads 999 is more than the {threads} core(s) this process may use; using {threads}" in err


def test_a_model_on_the_meta_device_is_refused_in_the_packages_words():
    with torch.device("meta"):
        model = tiny_model("llama", 0)
    with pytest.raises(ValueError, match="model: its weights are on the meta device") as caught:
        assisted_backends.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=2)
    assert "to_empty" not in str(caught.value)


@pytest.fixture
def gguf_file(tmp_path, monkeypatch) -> Path:
    """A tiny Llama `.gguf` (with its tokenizer) and a cache of this test's own."""
    pytest.importorskip("gguf")
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))
    tokenizer = train_tokenizer(read_corpus(60_000)[0], 300)
    model = tiny_model("llama", seed=0, vocab=len(tokenizer), init=0.1)
    return write_llama_gguf(model, tokenizer, tmp_path / "model.gguf")


def test_a_truncated_gguf_is_named_truncated(gguf_file, tmp_path):
    data = gguf_file.read_bytes()
    for size, words in ((len(data) // 2, "the GGUF file is truncated"), (10, "not a complete GGUF file")):
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(data[:size])
        for precision in (None, "fp32"):  # its own quantization, and the dequantized conversion
            with pytest.raises(files.ModelFileError, match=words) as caught:
                assisted_backends.generate(str(cut), torch.tensor([[1, 2]]), max_new_tokens=2, dtype=precision)
            assert "download or copy it again" in str(caught.value)


def test_a_renamed_gguf_is_not_converted_again(gguf_file, tmp_path):
    converted = Path(files.model_dir(gguf_file))
    made = (converted / "config.json").stat().st_mtime_ns
    renamed = tmp_path / "elsewhere" / "renamed-copy.gguf"
    renamed.parent.mkdir()
    shutil.copy2(gguf_file, renamed)
    assert Path(files.model_dir(renamed)) == converted
    assert (converted / "config.json").stat().st_mtime_ns == made
    assert len(list((converted.parent).iterdir())) == 2  # the one conversion and the digest index


def test_ctrl_c_prints_the_text_generated_so_far():
    # 3000 tokens: ~9 s at 3 ms/token, so a fast CPU is still generating when the signal arrives
    command = [sys.executable, "-m", "assisted_backends.cli", "--max-new-tokens", "3000", "--threads", "1"]
    run = subprocess.Popen(command,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=interruptible)  # fmt: skip
    seen = []
    while not seen or not (seen[-1].startswith("cpu:") or not seen[-1]):  # the summary: generation starts now
        seen.append(run.stderr.readline())
    time.sleep(1.5)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130, err
    assert "interrupted after " in err and "Traceback" not in err
    generated = int(err.split("interrupted after ")[1].split()[0])
    assert generated > 0 and out.strip(), (out, err)


def test_ctrl_c_in_a_batched_run_prints_the_finished_prompts():
    run = subprocess.Popen([sys.executable, "-m", "assisted_backends.cli", "--max-new-tokens", "3000", "--threads", "1",
                            "--batch-size", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=interruptible)  # fmt: skip
    seen = []
    while not seen or not (seen[-1].startswith("cpu:") or not seen[-1]):
        seen.append(run.stderr.readline())
    time.sleep(1.5)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130, err
    assert "Traceback" not in err
    finished = int(err.split("interrupted: ")[1].split()[0])
    assert out.count("--- prompt ") == finished  # each finished prompt printed under its number


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

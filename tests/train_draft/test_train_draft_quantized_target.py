"""`train-draft` on a `.gguf` target keeps the file's quantization (`--target-precision auto`): the data is generated
on the package's kernels, and the target's token tables, read through `target_tables.dense_rows`, are exactly the
rows the float conversion of the same file holds."""

from __future__ import annotations

import json

import pytest
import torch
from quantized_fixtures import Q4_K_M_LIKE, write_tiny_llama_gguf
from test_train_draft_chat import conversation, write_log

from assisted_backends.api import threads
from assisted_backends.hf_compat import model_device
from assisted_backends.model_facts import quantized_kernels
from assisted_backends.native import extension
from assisted_backends.train_draft.cli import main
from assisted_backends.train_draft.target_tables import dense_rows
from assisted_backends.train_draft.trainer import load_target

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


@pytest.fixture
def gguf_target(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))
    return write_tiny_llama_gguf(tmp_path / "target.gguf", Q4_K_M_LIKE)  # Q4_K, Q6_K, a tied Q8_0 table


def test_auto_keeps_the_files_quantization_and_its_tables_equal_the_float_conversion(gguf_target):
    quantized, _ = load_target(str(gguf_target), CPU, "auto")
    dense, _ = load_target(str(gguf_target), CPU, "fp32")
    expected = "blocks" if extension.available() else "aten"
    assert quantized_kernels(quantized) == {expected} and not quantized_kernels(dense)
    assert model_device(quantized) == CPU
    for table in ("get_input_embeddings", "get_output_embeddings"):
        rows = dense_rows(getattr(quantized, table)())
        assert torch.equal(rows.float(), getattr(dense, table)().weight.float()), table


def test_a_bad_target_precision_is_named(gguf_target):
    with pytest.raises(ValueError, match="target_precision='int3': choose one of auto, file, fp32"):
        load_target(str(gguf_target), CPU, "int3")


def test_train_draft_runs_on_a_quantized_gguf_target(gguf_target, tmp_path, capsys):
    log = tmp_path / "log.json"
    write_log(log, [conversation(i) for i in range(12)])
    args = [str(gguf_target), "--chat", str(log), "--chat-context", "96", "-o", str(tmp_path / "run"), "--minutes",
            "5", "--data-share", "0.9", "--new-tokens", "8", "--generation-batch", "4", "--held-out", "2",
            "--max-sequences", "4", "--max-steps", "2", "--draft-vocab", "128", "--top-k", "4", "--steps", "2",
            "--batch-size", "4", "--threads", "1", "--no-progress"]  # fmt: skip
    try:
        assert main(args) == 0
    finally:
        threads.forget()
    report = json.loads((tmp_path / "run" / "training.json").read_text())
    assert report["settings"]["target_precision"] == "auto"
    assert report["steps"] == 2 and report["sequences"] == 4
    assert "train-draft: 2 steps on 4 sequences" in capsys.readouterr().out

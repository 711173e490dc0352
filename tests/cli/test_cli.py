"""The command users run: tasks, JSON/CSV schema, flag validation, and the demo pair's preparation."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_fixtures import claiming_7b
from tiny_models import tiny_model
from transformers import AutoModelForCausalLM

from assisted_backends.cli import main
from assisted_backends.demo.corpus import read_corpus
from assisted_backends.demo.pair import SMOKE_BUDGET, ensure_demo_pair
from assisted_backends.demo.tokenizer import train_tokenizer

ROW_KEYS = {
    "prompt_tokens",
    "new_tokens",
    "total_s",
    "prefill_ms",
    "time_per_token_ms",
    "tokens_per_s",
    "acceptance_rate",
    "mean_accepted_length",
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    """A tiny Llama target, a perturbed-copy draft and a GPT-2 target, each saved with a locally trained tokenizer."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = train_tokenizer(read_corpus(100_000)[0], 300)
    vocab = len(tokenizer)
    target = tiny_model("llama", seed=0, vocab=vocab, init=0.1)
    draft = tiny_model("llama", seed=0, vocab=vocab, init=0.1)
    with torch.no_grad():
        for weight in draft.parameters():
            weight.add_(0.02 * weight.std().nan_to_num(0.0) * torch.randn_like(weight))
    models = {"target": target, "draft": draft, "gpt2": tiny_model("gpt2", seed=0, vocab=vocab)}
    for name, model in models.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_task_writes_the_json_schema(saved_pair, tmp_path, capsys):
    out = tmp_path / "out.json"
    code, stdout, stderr = _run(
        capsys,
        "-m",
        str(saved_pair / "target"),
        "--assistant-model",
        str(saved_pair / "draft"),
        "--max-new-tokens",
        "12",
        "--num-assistant-tokens",
        "3",
        "--dtype",
        "fp32",
        "--prompt",
        "def add(a, b):",
        "--json",
        str(out),
    )
    assert code == 0, stderr
    data = json.loads(out.read_text())
    assert set(data) >= {"text", "generated_token_ids", "stats", "runtime"}
    assert len(data["generated_token_ids"]) == 12 == data["stats"]["new_tokens"]
    assert data["stats"]["drafted"] > 0 and data["runtime"]["backend"] == "cpu"
    assert stdout.startswith("def add(a, b):") and data["text"] in stdout


def test_no_assisted_and_assisted_give_the_same_greedy_tokens(saved_pair, tmp_path, capsys):
    common = ["-m", str(saved_pair / "target"), "--max-new-tokens", "15", "--dtype", "fp32", "--prompt", "for i in"]
    plain, assisted = tmp_path / "plain.json", tmp_path / "assisted.json"
    assert _run(capsys, *common, "--no-assisted", "--json", str(plain))[0] == 0
    draft = ["--assistant_model", str(saved_pair / "draft"), "--num_assistant_tokens", "3"]
    assert _run(capsys, *common, *draft, "--json", str(assisted))[0] == 0
    plain_data, assisted_data = json.loads(plain.read_text()), json.loads(assisted.read_text())
    assert plain_data["generated_token_ids"] == assisted_data["generated_token_ids"]
    assert plain_data["stats"]["drafted"] == 0 and assisted_data["stats"]["drafted"] > 0


def test_sampling_with_a_seed_is_reproducible(saved_pair, tmp_path, capsys):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        code, _, err = _run(
            capsys,
            "-m",
            str(saved_pair / "target"),
            "--assistant-model",
            str(saved_pair / "draft"),
            "--do_sample",
            "--temperature",
            "0.8",
            "--top-k",
            "20",
            "--seed",
            "7",
            "--max-new-tokens",
            "10",
            "--dtype",
            "fp32",
            "--json",
            str(out),
        )
        assert code == 0, err
        runs.append(json.loads(out.read_text())["generated_token_ids"])
    assert runs[0] == runs[1] and len(runs[0]) == 10


def test_benchmark_compare_writes_table_json_and_csv(saved_pair, tmp_path, capsys):
    out_json, out_csv = tmp_path / "bench.json", tmp_path / "bench.csv"
    code, stdout, stderr = _run(
        capsys,
        "-m",
        str(saved_pair / "target"),
        "--assistant-model",
        str(saved_pair / "draft"),
        "--task",
        "benchmark",
        "--compare",
        "--num-assistant-tokens",
        "3",
        "--dtype",
        "fp32",
        "--prompt-lengths",
        "16",
        "24",
        "--new-tokens",
        "6",
        "9",
        "--repeats",
        "1",
        "--json",
        str(out_json),
        "--csv",
        str(out_csv),
    )
    assert code == 0, stderr
    for title in (
        "Example#",
        "Prompt Length (tokens)",
        "New Tokens Generated",
        "Total Time (s)",
        "Prefill Phase (ms)",
        "Time/Token (ms)",
        "Tokens/Sec",
        "Acceptance Rate",
        "Mean Accepted Length",
        "Speedup",
    ):
        assert title in stdout
    rows = json.loads(out_json.read_text())["rows"]
    assert [(r["prompt_tokens"], r["new_tokens"]) for r in rows] == [(16, 6), (16, 9), (24, 6), (24, 9)]
    assert all(ROW_KEYS <= set(r) and r["speedup"] > 0 and r["acceptance_rate"] is not None for r in rows)
    with open(out_csv) as handle:
        csv_rows = list(csv.DictReader(handle))
    assert [int(r["new_tokens"]) for r in csv_rows] == [r["new_tokens"] for r in rows]


def test_benchmark_plain_rows_have_null_acceptance(saved_pair, tmp_path, capsys):
    out = tmp_path / "plain.json"
    code, _, err = _run(
        capsys,
        "-m",
        str(saved_pair / "target"),
        "--no-assisted",
        "--task",
        "benchmark",
        "--prompt-lengths",
        "8",
        "--new-tokens",
        "4",
        "--repeats",
        "1",
        "--json",
        str(out),
    )
    assert code == 0, err
    (row,) = json.loads(out.read_text())["rows"]
    assert row["acceptance_rate"] is None and row["mean_accepted_length"] is None and row["new_tokens"] == 4


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--no-assisted", "--assistant-model", "x"], "--no-assisted conflicts with --assistant-model"),
        (["--compare"], "--compare belongs to --task benchmark"),
        (["--prompt", "a", "--prompt-file", "b"], "either --prompt or --prompt-file"),
        (["--temperature", "0.5"], "add --do_sample"),
        (["--task", "benchmark", "--plot", "x.png"], "--plot draws the speedup per case and needs"),
    ],
)
def test_conflicting_flags_fail_with_one_line(argv, message, capsys):
    code, _, stderr = _run(capsys, *argv)
    assert code == 2 and message in stderr and "Traceback" not in stderr


def test_missing_model_directory(tmp_path, capsys):
    code, _, stderr = _run(capsys, "-m", str(tmp_path / "nowhere"), "--no-assisted")
    assert code == 2 and f"-m/--model directory {tmp_path / 'nowhere'} does not exist" in stderr


def test_unknown_architecture_without_a_draft_lists_the_options(saved_pair, capsys):
    code, _, stderr = _run(capsys, "-m", str(saved_pair / "gpt2"))
    assert code == 2 and "no default draft for a 'gpt2' target" in stderr and "opt -> facebook/opt-125m" in stderr


def test_default_draft_that_is_not_on_disk_says_so_in_one_line(saved_pair, capsys):
    code, _, stderr = _run(capsys, "-m", str(claiming_7b(saved_pair / "target")), "--dtype", "fp32")
    assert code == 2
    assert "default draft PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T is not on this machine" in stderr
    assert len(stderr.strip().splitlines()[-1]) > 0 and "Traceback" not in stderr


def test_a_default_draft_larger_than_the_target_is_never_offered(saved_pair, capsys):
    code, _, stderr = _run(capsys, "-m", str(saved_pair / "target"), "--dtype", "fp32")
    assert code == 2 and "is not larger than its family's usual draft" in stderr and "--prompt-lookup 10" in stderr


def test_empty_prompt(saved_pair, capsys):
    code, _, stderr = _run(capsys, "-m", str(saved_pair / "target"), "--no-assisted", "--prompt", "  ")
    assert code == 2 and "the prompt is empty" in stderr


def test_unknown_device_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "tpu"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err == "error: --device: 'tpu' is not one of auto, cpu, cuda, hpu\n", err


TINY_BUDGET = SMOKE_BUDGET


def test_demo_pair_preparation_is_deterministic_and_cached(tmp_path, monkeypatch):
    first = ensure_demo_pair(tmp_path / "a", TINY_BUDGET, progress=False)
    second = ensure_demo_pair(tmp_path / "b", TINY_BUDGET, progress=False)
    for directory in (first.target_dir, first.draft_dir):
        assert (directory / "config.json").is_file() and (directory / "tokenizer.json").is_file()
    a = AutoModelForCausalLM.from_pretrained(first.target_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(second.target_dir).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "same budget and seed must give bit-identical weights"

    import assisted_backends.demo.pair as pair_module

    monkeypatch.setattr(pair_module, "_prepare", lambda *a, **k: pytest.fail("a cached pair must not be retrained"))
    assert ensure_demo_pair(tmp_path / "a", TINY_BUDGET, progress=False) == first


def _console_script(name: str) -> str:
    """The entry point installed with this interpreter (a venv's bin/ need not be on PATH)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    assert found, f"console script {name!r} is not installed: pip install -e ."
    return found


def test_console_script_runs_the_demo_pair_end_to_end(tmp_path):
    """The installed entry point with no model arguments: prepares the (smoke-budget) demo pair, then generates."""
    completed = subprocess.run(
        [
            _console_script("run-assisted-generation"),
            "--demo-pair",
            "smoke",
            "--demo-dir",
            str(tmp_path),
            "--max-new-tokens",
            "8",
            "--dtype",
            "fp32",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    assert "SMOKE demo pair" in completed.stderr and "acceptance rate" in completed.stderr
    assert "class Stack:\n" in completed.stdout  # the demo prompt, then the continuation

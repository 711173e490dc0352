"""The command users run: its two tasks and their JSON/CSV schema (generate's tokens with and without a draft
and under a seed, the benchmark's table and rows), the validation of the flags themselves (conflicts, unknown
flags and values, no abbreviations; one line each, answered before torch loads), the demo pair's preparation,
and the installed console script running it end to end."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch
from cli_fixtures import ROOT, cli_env, console_script, imported_modules, messages, run_cli, run_main
from transformers import AutoModelForCausalLM

from assisted_backends.cli import args as cli_args
from assisted_backends.cli import main
from assisted_backends.demo.pair import SMOKE_BUDGET, ensure_demo_pair
from assisted_backends.startup.flags import one_line

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


def test_generate_task_writes_the_json_schema(saved_pair, tmp_path, capsys):
    out = tmp_path / "out.json"
    code, stdout, stderr = run_main(
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
    assert run_main(capsys, *common, "--no-assisted", "--json", str(plain))[0] == 0
    draft = ["--assistant_model", str(saved_pair / "draft"), "--num_assistant_tokens", "3"]
    assert run_main(capsys, *common, *draft, "--json", str(assisted))[0] == 0
    plain_data, assisted_data = json.loads(plain.read_text()), json.loads(assisted.read_text())
    assert plain_data["generated_token_ids"] == assisted_data["generated_token_ids"]
    assert plain_data["stats"]["drafted"] == 0 and assisted_data["stats"]["drafted"] > 0


def test_sampling_with_a_seed_is_reproducible(saved_pair, tmp_path, capsys):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        code, _, err = run_main(
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
    code, stdout, stderr = run_main(
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
    code, _, err = run_main(
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
    code, _, stderr = run_main(capsys, *argv)
    assert code == 2 and message in stderr and "Traceback" not in stderr


def test_unknown_device_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "tpu"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err == "error: --device: 'tpu' is not one of auto, cpu, cuda, hpu\n", err


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--prompt-lookpu", "10"], "error: unknown flag --prompt-lookpu; did you mean --prompt-lookup?"),
        (["--max-new-token", "8"], "error: unknown flag --max-new-token; did you mean --max-new-tokens?"),
        (["--max-new-tokens", "x"], "error: --max-new-tokens: expected a positive integer, got 'x'"),
        (["--dtype", "fp8"], "error: --dtype: 'fp8' is not one of auto, fp32, bf16, fp16, int8, int4"),
    ],
)
def test_argument_errors_are_one_line_with_the_closest_flag_and_no_prefix_matching(argv, expected):
    run = run_cli(*argv, PYTHONPROFILEIMPORTTIME="1")
    assert run.returncode == 2 and messages(run) == [expected], run.stderr[-2000:]
    imported = imported_modules(run)
    assert imported and "torch" not in imported and "transformers" not in imported


def test_the_parser_takes_no_abbreviations():
    parser = cli_args.build_parser(["auto", "cpu"])
    assert parser.allow_abbrev is False
    message = one_line("unrecognized arguments: --zzzz", parser.flags(), parser.prog)
    assert message == "unknown flag --zzzz (run-assisted-generation --help lists the flags)"


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


def test_console_script_runs_the_demo_pair_end_to_end(tmp_path):
    """The installed entry point with no model arguments: prepares the (smoke-budget) demo pair, then generates."""
    completed = subprocess.run(
        [
            console_script(),
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


def test_subprocesses_run_this_checkout():
    code = "import assisted_backends, pathlib; print(pathlib.Path(assisted_backends.__file__).resolve())"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd="/")
    assert run.stdout.strip() == str(ROOT / "assisted_backends" / "__init__.py"), run.stdout

"""`--batch-size`: the command generates and benchmarks batches (docs/cli.md, --batch-size; docs/design.md rule 7).

A prompt file through N slots (each refilled as its row ends) gives, prompt by prompt, the text the same
prompt gives alone; the benchmark's
table and JSON gain the batch size, aggregate tokens/s, per-row latency and transformers' batched
`model.generate` next to plain and assisted decoding; bad values are refused before models load.
"""

from __future__ import annotations

import json

import pytest
from test_cli import _run, saved_pair  # noqa: F401  (the module-scoped fixture)

from assisted_backends.cli import main

PROMPTS = ["The first prompt is", "A second, longer prompt about something else entirely", "Three"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _models(root) -> list[str]:
    return ["-m", str(root / "target"), "--assistant-model", str(root / "draft"), "--no-stream"]


def test_a_prompt_file_batch_gives_each_prompt_its_own_text(saved_pair, tmp_path, capsys):  # noqa: F811
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS) + "\n\n")  # a blank line is not a prompt
    alone = []
    for prompt in PROMPTS:
        out = tmp_path / "alone.json"
        code, _, err = _run(
            capsys, *_models(saved_pair), "--prompt", prompt, "--max-new-tokens", "12", "--json", str(out)
        )
        assert code == 0, err
        alone.append(json.loads(out.read_text())["generated_token_ids"])
    out = tmp_path / "batch.json"
    code, stdout, err = _run(
        capsys, *_models(saved_pair), "--prompt-file", str(prompt_file), "--batch-size", "2", "--max-new-tokens", "12",
        "--json", str(out),
    )  # fmt: skip
    assert code == 0, err
    record = json.loads(out.read_text())
    assert record["generated_token_ids"] == alone, "row by row the same tokens as each prompt alone"
    stats = record["stats"]
    assert stats["batch_size"] == 2 and stats["joins"] == 1, "3 prompts through 2 slots: the third takes a freed one"
    assert stdout.count("--- prompt ") == 3 and "batch of 2" in err


def test_benchmark_batches_report_batch_aggregate_rate_and_transformers(saved_pair, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "bench.json"
    code, stdout, err = _run(
        capsys, *_models(saved_pair), "--task", "benchmark", "--compare", "--batch-size", "3", "--prompt-lengths", "12",
        "--new-tokens", "8", "--repeats", "1", "--time-limit", "0", "--json", str(out),
    )  # fmt: skip
    assert code == 0, err
    row = json.loads(out.read_text())["rows"][0]
    assert row["batch_size"] == 3 and row["new_tokens"] == 8
    assert row["tokens_per_s"] == pytest.approx(3 * 8 / row["total_s"])
    assert row["transformers_tokens_per_s"] > 0 and row["row_latency_s"] <= row["total_s"]
    assert row["speedup_vs_transformers"] == pytest.approx(row["tokens_per_s"] / row["transformers_tokens_per_s"])
    assert "transformers Tokens/Sec" in stdout and "Row Latency (s)" in stdout


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--batch-size", "0"], "error: --batch-size: expected a positive integer, got 0"),
        (["--batch-size", "2", "--stream"], "--stream prints one sequence as it grows; drop it with --batch-size > 1"),
    ],
)
def test_bad_batch_flags_are_refused_before_loading(extra, message, capsys):
    try:
        code = main(["-m", "/nonexistent/model", "--no-assisted", *extra])
    except SystemExit as exit_:  # argparse's own type errors exit with status 2
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err

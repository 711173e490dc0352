"""The parsers of llama.cpp's tool output (`benchmarks.harness.llama_cpp_tools`) on captured output
(tests/llama_cpp_samples, see its README): no build, no model."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.harness.llama_cpp_tools import (
    cache_key,
    parse_bench,
    parse_bench_json,
    parse_bench_markdown,
    parse_completion,
    parse_lookup,
    parse_perf_context,
    parse_speculative,
    summarize_bench,
)

SAMPLES = Path(__file__).resolve().parents[1] / "llama_cpp_samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_bench_json() -> None:
    rows = parse_bench_json(sample("llama-bench.json"))
    assert [(r["threads"], r["test"]) for r in rows] == [
        (1, "pp128"), (1, "pp512"), (1, "tg32"), (2, "pp128"), (2, "pp512"), (2, "tg32")
    ]  # fmt: skip
    assert rows[0]["avg_ts"] == pytest.approx(164.090416)
    assert rows[0]["samples_ts"] == [138.449, 189.732]
    assert rows[2]["n_gen"] == 32 and rows[2]["n_prompt"] == 0
    assert rows[0]["model_type"] == "llama 256M Q4_1" and rows[0]["build_commit"] == "0c1e570"
    summary = summarize_bench(rows)
    assert summary[1]["decode_tok_s"] == pytest.approx(116.027806)
    assert summary[2]["prefill_tok_s"] == {128: pytest.approx(58.990796), 512: pytest.approx(64.29211)}
    assert summary[1]["decode_tokens"] == 32


def test_bench_json_among_log_lines() -> None:
    text = "load_backend: loaded CPU backend [x]\n[ 1, 2 ]\n" + sample("llama-bench.json") + "\nbye [0]\n"
    assert parse_bench_json(text) == parse_bench_json(sample("llama-bench.json"))
    with pytest.raises(ValueError):
        parse_bench_json("[1, 2] [")


def test_bench_markdown_and_fallback() -> None:
    rows = parse_bench_markdown(sample("llama-bench.md"))
    assert [(r["threads"], r["test"], r["avg_ts"]) for r in rows] == [(1, "pp64", 128.33), (1, "tg8", 82.0)]
    assert parse_bench(sample("llama-bench.md")) == rows  # not JSON: the table is read
    assert summarize_bench(rows)[1] == {
        "prefill_tok_s": {64: 128.33}, "prefill_stddev": {64: 0.0}, "decode_tok_s": 82.0, "decode_stddev": 0.0,
        "decode_tokens": 8,
    }  # fmt: skip
    combined = parse_bench_markdown("| model | threads | test | t/s |\n| --- | ---: | ---: | ---: |\n"
                                    "| llama 7B Q4_K | 2 | pp512+tg128 | 10.50 ± 0.25 |\n"
                                    "| llama 7B Q4_K | 2 | tg128 @ d512 | 5.25 ± 0.01 |\n")  # fmt: skip
    assert [(r["test"], r["n_prompt"], r["n_gen"], r["n_depth"], r["stddev_ts"]) for r in combined] == [
        ("pp512+tg128", 512, 128, 0, 0.25), ("tg128 @ d512", 0, 128, 512, 0.01)
    ]  # fmt: skip
    with pytest.raises(ValueError):
        parse_bench("no table here")


def test_lookup() -> None:
    out = parse_lookup(sample("llama-lookup.txt"))
    assert out["prompt_tokens"] == 188 and out["prompt_s"] == pytest.approx(1.441)
    assert out["prompt_tok_s"] == pytest.approx(188 / 1.441)  # not the printed 175.6 (the grown token list / s)
    assert out["new_tokens"] == 65 and out["decode_s"] == pytest.approx(1.972)
    assert out["decode_tok_s"] == pytest.approx(65 / 1.972)
    assert (out["n_draft"], out["n_predict"], out["n_drafted"], out["n_accept"]) == (10, 65, 108, 22)
    assert out["accept"] == pytest.approx(22 / 108)
    assert out["target_passes"] == 43 and out["tokens_per_pass"] == pytest.approx(65 / 43)
    assert out["target"]["eval_runs"] == 30 and out["target"]["prompt_tokens"] == 308


def test_speculative_ngram_and_draft_model() -> None:
    out = parse_speculative(sample("llama-speculative-simple.txt"))
    assert (out["new_tokens"], out["n_drafted"], out["n_accept"]) == (65, 48, 2)
    assert out["decode_tok_s"] == pytest.approx(65 / 0.942)
    drafted = parse_speculative(sample("llama-speculative-simple-draft.txt"))
    assert (drafted["n_draft"], drafted["n_predict"], drafted["n_accept"], drafted["accept"]) == (4, 17, 0, 0.0)
    assert drafted["target"]["eval_tok_s"] is None  # "0.00 ms / 1 runs ... inf tokens per second"
    assert drafted["tokens_per_pass"] == 1.0


def test_lookup_without_drafts_and_missing_summary() -> None:
    text = "decoded   10 tokens in    0.500 seconds, speed:   20.000 t/s\n"
    text += "n_drafted    = 0\nn_accept     = 0\naccept = -nan%\n"
    out = parse_lookup(text)
    assert out["accept"] is None and out["decode_tok_s"] == pytest.approx(20.0) and "prompt_tokens" not in out
    with pytest.raises(ValueError):
        parse_lookup("llama_model_load: error loading model")


def test_completion() -> None:
    out = parse_completion(sample("llama-completion.txt"))
    assert out["prompt_tokens"] == 188 and out["prompt_tok_s"] == pytest.approx(188 / 0.99364)
    assert out["new_tokens"] == 63 and out["decode_tok_s"] == pytest.approx(63 / 0.56359)
    assert parse_perf_context("nothing") == {}
    with pytest.raises(ValueError):
        parse_completion("prompt eval time = 1.0 ms / 2 tokens")


def test_cache_key_names_version_and_flags() -> None:
    key = cache_key()
    assert key.startswith("lcpp-") and len(key.rsplit("-", 1)[1]) == 10


def test_generated_text_after_the_echoed_prompt() -> None:
    from benchmarks.harness.llama_cpp_tools import generated_text

    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert generated_text("\n\n" + prompt + "Hello there.\n\n", prompt) == "Hello there."
    assert generated_text("\n\n<s>▁Add▁type▁hints.t7t9\n\n", "Add type hints.") == "t7t9"
    assert generated_text("\nplain output\n") == "plain output"
    lookup = sample("llama-lookup.txt")  # stdout (the echoed prompt, then the generated text), then stderr
    echoed = lookup[2 : lookup.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")]
    assert generated_text(lookup, echoed).startswith("```python\ndef total_covered(intervals, gap=0):")


def test_clear_error_without_cmake(tmp_path, monkeypatch) -> None:
    import benchmarks.harness.llama_cpp_tools as tools

    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path))
    monkeypatch.setattr(tools.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert tools.llama_cpp_tools(build=False) == {}  # nothing cached, nothing built
    with pytest.raises(tools.LlamaCppToolsError, match="needs cmake and a C\\+\\+ compiler"):
        tools.llama_cpp_tools()

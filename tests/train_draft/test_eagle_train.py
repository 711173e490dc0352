"""`train-draft` on the demo target: seconds of training raise held-out acceptance above the untrained head's,
the run resumes where it stopped, and its output directory is a head that `generate` loads."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
from collections import Counter

import pytest
import torch
from eagle_fixtures import DEMO_DIR, demo_prompts, demo_target
from tiny_models import reference_greedy

from assisted_backends import generate
from assisted_backends.drafters.eagle import is_eagle_checkpoint, load_head
from assisted_backends.train_draft.cli import parser, settings_from
from assisted_backends.train_draft.corpus import (
    OPEN_REQUESTS,
    Document,
    PromptSource,
    prose_words,
    read_documents,
    split_documents,
)
from assisted_backends.train_draft.trainer import TrainSettings, train
from assisted_backends.train_draft.vocab import choose_vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """The demo pair's held-out text cut into 24 documents (one or more of them end up held out)."""
    root = tmp_path_factory.mktemp("texts")
    text = (DEMO_DIR / "held_out.txt").read_text()
    lines = text.splitlines(keepends=True)
    per = len(lines) // 24
    for i in range(24):
        (root / f"doc{i:02d}.py").write_text("".join(lines[i * per : (i + 1) * per]))
    return root


def _settings(texts, output, steps: int) -> TrainSettings:
    """A fixed amount of work (64 sequences, `steps` steps) well inside its time budget, however busy the machine."""
    return TrainSettings(
        target=str(DEMO_DIR / "target"), text=(str(texts),), output=str(output), minutes=10.0, data_share=0.9,
        prompt_tokens=24, new_tokens=24, generation_batch=16, held_out=8, max_sequences=64, max_steps=steps,
        draft_vocab=512,
        top_k=4, steps=3, batch_size=8, learning_rate=3e-3, eval_every_s=1e9, checkpoint_every_s=1e9,
        progress_bar=False,
    )  # fmt: skip


def test_seconds_of_training_raise_held_out_acceptance_and_resume(texts, tmp_path):
    target, tokenizer = demo_target()
    first = train(_settings(texts, tmp_path / "run", 30), target, tokenizer)
    assert first.after.acceptance > first.before.acceptance + 0.03
    assert first.after.rates[0] > 0.1 and first.training_sequences == 64
    assert is_eagle_checkpoint(tmp_path / "run")
    report = json.loads((tmp_path / "run" / "training.json").read_text())
    assert report["steps"] == first.steps and report["vocabulary_coverage"] > 0.5

    resumed = train(_settings(texts, tmp_path / "run", 45), target, tokenizer)
    assert (
        first.steps == 30 and resumed.steps == 45 and resumed.training_sequences == 64
    )  # no new data: the data phase was done
    head = load_head(tmp_path / "run", torch.float32)
    assert head.embed_tokens is not None  # SpecForge's layout carries the embedding
    accepted = 0
    for window in demo_prompts(3, 20, seed=99):  # one window may accept nothing: α is a mean
        prompt = torch.tensor([window])
        result = generate(target, prompt, assistant_model=str(tmp_path / "run"), max_new_tokens=30,
                          num_assistant_tokens=3)  # fmt: skip
        assert torch.equal(result.sequences, reference_greedy(target, prompt, 30))
        accepted += result.stats.accepted
    assert accepted > 0


def test_the_held_out_split_does_not_depend_on_where_the_files_sit(texts, tmp_path):
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(texts, moved)
    here, there = (split_documents(read_documents([root])) for root in (texts, moved))
    assert [d.name for d in here[1]] == [d.name for d in there[1]] and len(here[0]) + len(here[1]) == 24
    assert {d.name for d in here[1]} == {"doc06.py"}  # sha256 of the name, not of the temporary directory


def test_the_draft_vocabulary_is_the_targets_most_chosen_tokens():
    counts = torch.tensor([0, 5, 1, 9, 0, 3])
    d2t, t2d = choose_vocabulary(counts, 3)
    assert t2d.tolist() == [False, True, False, True, False, True]
    assert (torch.arange(3) + d2t).tolist() == [1, 3, 5]  # target id = draft id + d2t[draft id]


def test_command_line_maps_onto_settings():
    args = parser().parse_args(["smollm2-135m-instruct", "--text", "a", "b", "-o", "out", "--minutes", "60",
                                "--chat-share", "0.8", "--open-share", "0.3", "--draft-vocab", "4096"])  # fmt: skip
    settings = settings_from(args)
    assert settings.target == "smollm2-135m-instruct" and settings.text == ("a", "b") and settings.minutes == 60
    assert settings.chat_share == 0.8 and settings.open_share == 0.3
    assert settings.draft_vocab == 4096 and settings.embed_tokens is True
    help_text = subprocess.run([sys.executable, "-m", "assisted_backends.train_draft", "--help"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "--minutes" in help_text and "SpecForge" in help_text


class CharacterTokenizer:
    """A stand-in tokenizer (one id per character) with a chat template, enough for the prompt source's logic."""

    chat_template = "{{ messages }}"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))

    def apply_chat_template(self, messages, add_generation_prompt: bool, tokenize: bool) -> list[int]:
        return self(f"<user>{messages[0]['content']}<assistant>")["input_ids"]


def test_open_requests_take_their_topics_from_prose_lines_not_code():
    text = "def parse_header(raw_bytes, offset):\n    return unpack_from(raw_bytes, offset)\n" \
           "# The mailbox keeps every message until the reader deletes it explicitly.\n"  # fmt: skip
    words = prose_words(text)
    assert "mailbox" in words and "message" in words and "parse_header" not in words and "unpack_from" not in words
    documents = [Document(f"doc{i}.py", text * 8) for i in range(3)]
    tokenizer = CharacterTokenizer()
    prompts = [tokenizer.decode(p) for p in itertools.islice(PromptSource(documents, tokenizer, 40, 0, 1.0, 1.0), 50)]
    assert all(p.startswith("<user>") and p.endswith("<assistant>") for p in prompts)
    topics_seen = {w for w in words if any(w in p for p in prompts)}
    assert topics_seen and any(p.count(" and ") for p in prompts)
    templates = {t.split("{topic}")[0] for t in OPEN_REQUESTS}
    assert len({next(t for t in templates if p[len("<user>") :].startswith(t)) for p in prompts}) > 10

    mixed = list(itertools.islice(PromptSource(documents, tokenizer, 40, 1, 0.5, 0.5), 400))
    kinds = Counter("open" if any(tokenizer.decode(p)[6:].startswith(t) for t in templates) else
                    "chat" if tokenizer.decode(p).startswith("<user>") else "raw" for p in mixed)  # fmt: skip
    assert abs(kinds["open"] / 400 - 0.25) < 0.07 and abs(kinds["chat"] / 400 - 0.25) < 0.07
    assert abs(kinds["raw"] / 400 - 0.5) < 0.07


def test_a_base_model_gets_its_requests_as_plain_text():
    class BaseTokenizer(CharacterTokenizer):
        chat_template = None

    documents = [Document("doc.py", "# The mailbox keeps every message until the reader deletes it explicitly.\n" * 8)]
    prompts = list(itertools.islice(PromptSource(documents, BaseTokenizer(), 40, 0, 1.0, 1.0), 20))
    texts = [BaseTokenizer().decode(p) for p in prompts]
    assert all(t.endswith("\n\n") and "<user>" not in t for t in texts)
    assert all(any(t.startswith(r.split("{topic}")[0]) for r in OPEN_REQUESTS) for t in texts)


def _small(texts, output, minutes: float, data_share: float, **changes) -> TrainSettings:
    """A time-bound run: the budget, not a count, ends each phase (as `train-draft --minutes 3` on a real model)."""
    values = dict(target=str(DEMO_DIR / "target"), text=(str(texts),), output=str(output), minutes=minutes,
                  data_share=data_share, prompt_tokens=24, new_tokens=64, generation_batch=16, held_out=64,
                  draft_vocab=512, top_k=4, steps=3, batch_size=8, learning_rate=3e-3, eval_every_s=1e9,
                  checkpoint_every_s=1e9, progress_bar=True)  # fmt: skip
    return TrainSettings(**{**values, **changes})


def test_a_small_budget_sizes_the_held_out_data_stops_generating_on_time_and_counts_in_its_units(
    texts, tmp_path, capsys
):
    target, tokenizer = demo_target()
    result = train(_small(texts, tmp_path / "run", minutes=0.25, data_share=0.5), target, tokenizer)
    progress = json.loads((tmp_path / "run" / "state" / "progress.json").read_text())
    data_s, budget_s = progress["seconds"]["data"], 0.25 * 60 * 0.5
    assert data_s <= budget_s + 1.0, f"the data phase took {data_s:.1f} s of its {budget_s:.1f} s"
    held_out = torch.load(tmp_path / "run" / "data" / "held_out.pt", weights_only=True)
    assert 0 < len(held_out) < 64  # 64 asked, sized to a quarter of the data budget
    assert result.training_sequences > 0 and result.steps > 0
    err = capsys.readouterr().err
    for phase, unit in (("held-out data", "seq"), ("training data", "seq"), ("training", "step")):
        assert re.search(rf"{phase}: .*{unit}", err), f"no {phase!r} bar counted in {unit!r}: {err[-800:]!r}"
    assert not re.search(r"[\d.]+s/s\b", err)  # no seconds-per-second rates ("30.16s/s"): each bar its own units


def test_a_run_that_made_no_data_resumes_with_a_larger_budget(texts, tmp_path):
    target, tokenizer = demo_target()
    with pytest.raises(RuntimeError, match="run again with a larger --minutes .* on the same --output: it resumes"):
        train(_small(texts, tmp_path / "run", minutes=1.0, data_share=0.0001, progress_bar=False), target, tokenizer)
    progress = json.loads((tmp_path / "run" / "state" / "progress.json").read_text())
    assert progress.get("sequences", 0) == 0
    resumed = train(_small(texts, tmp_path / "run", minutes=1.0, data_share=0.2, max_steps=5, progress_bar=False),
                    target, tokenizer)  # fmt: skip
    assert resumed.training_sequences > 0 and resumed.steps == 5


def test_generation_batches_are_sized_to_the_time_left_and_estimates_follow_the_measured_rate():
    from assisted_backends.train_draft.trainer import batch_that_fits, projected_total

    assert batch_that_fits(16, None, 30.0) == 16  # no rate yet: the wanted size (the first batch is capped apart)
    assert batch_that_fits(16, 2.0, 9.0) == 4  # 2 s a sequence, 9 s left: 4 fit
    assert batch_that_fits(16, 2.0, 1.0) == 0 and batch_that_fits(16, 2.0, -1.0) == 0
    assert projected_total(0, 0.0, 60.0) is None  # nothing measured: no estimate, rather than a wrong one
    assert projected_total(10, 5.0, 20.0) == 50  # 2 a second, 20 s more
    assert projected_total(10, 5.0, 20.0, cap=30) == 30

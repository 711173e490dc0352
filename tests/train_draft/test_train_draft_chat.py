"""`train-draft --chat`: ShareGPT-format chat logs as training prompts (`train_draft.chat`) on a tiny file written
here: the cut-off-file reader, the cached index, the seeded split, rendering with history, truncation from the
front, resume, and the command end to end on the demo target."""

from __future__ import annotations

import itertools
import json

import pytest
from eagle_fixtures import DEMO_DIR, demo_target

from assisted_backends.api import threads
from assisted_backends.loading.models import load_tokenizer
from assisted_backends.train_draft import chat, trainer
from assisted_backends.train_draft.cli import main, parser, settings_from
from assisted_backends.train_draft.data import load_shard
from assisted_backends.train_draft.trainer import TrainSettings, prompt_streams, train

pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip
QUESTIONS = ("How do I reverse a list in Python?", "¿Cuál es la capital de Francia?", "Écris un poème sur la mer.",
             "What does `git rebase -i` do?", "Explain recursion with an example.", "日本の首都はどこですか？",
             "def add(a, b):\n    return a - b\n# why does this fail?", "Write a haiku about autumn.")  # fmt: skip


def conversation(number: int, exchanges: int = 2) -> dict:
    """A ShareGPT-format conversation: `exchanges` human/gpt pairs in several languages, code included."""
    turns = []
    for k in range(exchanges):
        question = QUESTIONS[(number + k) % len(QUESTIONS)]
        turns.append({"from": "human", "value": f"[c{number} q{k}] {question}"})
        turns.append({"from": "gpt", "value": f"[c{number} a{k}] Here is an answer: use `items[::-1]`, ça marche."})
    return {"id": f"conv{number}_0", "conversations": turns}


def write_log(path, conversations: list[dict]) -> str:
    """The conversations as one indented UTF-8 JSON list, as ShareGPT ships them; returns the text written."""
    text = json.dumps(conversations, indent=2, ensure_ascii=False)
    path.write_text(text, encoding="utf-8")
    return text


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Indexes go to a cache directory of the test's own."""
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def templated():
    """The demo tokenizer with a chat template (the demo target is a base model)."""
    tokenizer = load_tokenizer(DEMO_DIR / "target")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_a_file_cut_off_inside_a_string_yields_exactly_the_complete_conversations(tmp_path):
    conversations = [conversation(i, 1 + i % 3) for i in range(6)]
    text = write_log(tmp_path / "whole.json", conversations)
    cut = text.index("[c4 a0] Here is")  # inside a string of the fifth conversation
    (tmp_path / "cut.json").write_bytes(text[: cut + 5].encode("utf-8"))
    for chunk in (7, 64, 1 << 20):  # chunk borders inside elements and inside multi-byte characters
        elements, complete = chat.scan(tmp_path / "cut.json", chunk)
        assert [value for _, _, value in elements] == conversations[:4] and not complete
        whole, complete = chat.scan(tmp_path / "whole.json", chunk)
        assert [value for _, _, value in whole] == conversations and complete
    data = (tmp_path / "cut.json").read_bytes()
    assert [json.loads(data[o : o + n]) for o, n, _ in elements] == conversations[:4]  # byte ranges read back
    (tmp_path / "object.json").write_text('{"id": 1}')
    with pytest.raises(ValueError, match=r"--chat .*object.json: not a ShareGPT-format JSON list"):
        chat.scan(tmp_path / "object.json")
    with pytest.raises(FileNotFoundError, match="--chat nowhere.json: no such file; give a ShareGPT-format"):
        chat.resolve_chat_file("nowhere.json")


def test_the_index_is_built_once_and_cached_until_the_file_changes(tmp_path, cache, monkeypatch):
    path = tmp_path / "log.json"
    write_log(path, [conversation(i) for i in range(5)] + [{"id": "empty", "conversations": []}])
    index = chat.load_index(path)
    assert [e.id for e in index.entries] == [f"conv{i}_0" for i in range(5)] and index.complete
    assert all(e.user_turns == 2 for e in index.entries) and list(cache.glob("chat_index/log.json.*.json"))
    assert chat.read_conversation(path, index.entries[3])[2]["content"].startswith("[c3 q1]")

    def no_scan(*_args, **_kwargs):
        raise AssertionError("the file was scanned again")

    monkeypatch.setattr(chat, "scan", no_scan)
    assert chat.load_index(path) == index  # from the cache: not parsed again
    write_log(path, [conversation(i) for i in range(7)])
    with pytest.raises(AssertionError, match="scanned again"):
        chat.load_index(path)  # a changed file is indexed anew


def test_the_split_is_seeded_stable_disjoint_and_keeps_the_parts_of_a_conversation_together():
    entries = [chat.Entry(0, 0, f"c{i}_{part}", 1) for i in range(400) for part in range(2)]
    training, held = chat.split_entries(entries, seed=0)
    assert chat.split_entries(entries, seed=0) == (training, held)
    assert not {e.id for e in training} & {e.id for e in held} and len(training) + len(held) == len(entries)
    assert 0.02 < len(held) / len(entries) < 0.09
    stem = {e.id.split("_")[0] for e in held}
    assert all(e.id.split("_")[0] in stem for e in entries if e in held) and not any(
        e.id.split("_")[0] in stem for e in training
    )  # both parts of a conversation on the same side
    more = entries + [chat.Entry(0, 0, f"new{i}", 1) for i in range(50)]
    assert set(held) <= set(chat.split_entries(more, seed=0)[1])  # more conversations move none of the old ones
    assert chat.split_entries(entries, seed=1)[1] != held
    few = entries[:4]
    small_training, small_held = chat.split_entries(few, seed=0)
    assert small_training and small_held and not set(small_training) & set(small_held)
    with pytest.raises(ValueError, match="--chat: 1 conversation.* give at least 2"):
        chat.split_entries(entries[:1], seed=0)


def test_each_human_turn_is_a_prompt_rendered_with_the_conversation_before_it(tmp_path, templated):
    path = tmp_path / "log.json"
    write_log(path, [conversation(1, 2)])
    index = chat.load_index(path)
    prompts = list(itertools.islice(chat.ChatPrompts(index, index.entries, templated, 4000, 0).prompts(), 2))
    first, second = (templated.decode(p) for p in prompts)
    assert first.startswith("<|user|>[c1 q0]") and first.endswith("<|assistant|>") and "[c1 a0]" not in first
    assert "[c1 q0] ¿Cuál es la capital" in first  # non-English turns kept
    assert second.startswith("<|user|>[c1 q0]") and second.endswith("<|assistant|>")
    assert "<|assistant|>[c1 a0] Here is an answer: use `items[::-1]`, ça marche." in second
    assert "<|user|>[c1 q1] Écris un poème" in second and "[c1 a1]" not in second
    plain = load_tokenizer(DEMO_DIR / "target")  # a base model: the turns as plain text, blank lines between
    base = list(itertools.islice(chat.ChatPrompts(index, index.entries, plain, 4000, 0).prompts(), 2))[1]
    expected = "[c1 q0] ¿Cuál es la capital de Francia?\n\n[c1 a0] Here is an answer: use `items[::-1]`, ça " \
               "marche.\n\n[c1 q1] Écris un poème sur la mer.\n\n"  # fmt: skip
    assert base == plain(expected)["input_ids"]


def test_long_conversations_are_truncated_from_the_front(tmp_path, templated):
    messages = chat.turns_of(conversation(0, 12))[:-1]  # up to the last human turn
    limit = 120
    ids = chat.fit_context(templated, messages, limit)
    text = templated.decode(ids)
    assert len(ids) <= limit and len(chat.render(templated, messages)) > 3 * limit
    assert text.startswith("<|user|>") and text.endswith("[c0 q11] " + QUESTIONS[11 % 8] + "\n<|assistant|>")
    assert "[c0 q0]" not in text and "[c0 a10]" in text  # the earliest turns went, the latest exchange stayed
    longer = chat.fit_context(templated, messages, 2 * limit)
    assert len(ids) < len(longer) <= 2 * limit  # the fewest turns dropped
    code = "def first_line():\n    pass\n" + "x = compute(x) + 1\n" * 200 + "print('the very end')"
    alone = chat.fit_context(templated, [{"role": "user", "content": code}], 60)
    cut = templated.decode(alone)
    assert len(alone) <= 60 and cut.startswith("<|user|>") and cut.endswith("print('the very end')\n<|assistant|>")
    assert "first_line" not in cut  # a single turn too long loses its beginning
    with pytest.raises(ValueError, match="--chat-context 20 leaves 4 prompt tokens after --new-tokens 16"):
        chat.context_limit(None, templated, 16, 20)


def _settings(log, output, **changes) -> TrainSettings:
    """A small chat run on the demo target: prompts of at most 80 tokens, answers of 16."""
    values = dict(target=str(DEMO_DIR / "target"), text=(), chat=str(log), chat_context=96, output=str(output),
                  minutes=10.0, data_share=0.9, new_tokens=16, generation_batch=3, held_out=3, max_sequences=6,
                  max_steps=2, draft_vocab=512, top_k=4, steps=3, batch_size=4, learning_rate=3e-3,
                  eval_every_s=1e9, checkpoint_every_s=1e9, progress_bar=False)  # fmt: skip
    return TrainSettings(**{**values, **changes})


def test_an_interrupted_run_continues_with_the_next_prompts(tmp_path, monkeypatch):
    log = tmp_path / "log.json"
    write_log(log, [conversation(i, 2 + i % 2) for i in range(16)])
    target, tokenizer = demo_target()
    real, calls = trainer.generate_examples, []

    def interrupted(*args, **kwargs):
        calls.append(len(args[2]))
        if len(calls) == 3:  # held-out, one training batch, then the process is stopped
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "generate_examples", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(_settings(log, tmp_path / "run"), target, tokenizer)
    progress = json.loads((tmp_path / "run" / "state" / "progress.json").read_text())
    assert progress["prompts_used"] == 3 and progress["sequences"] == 3
    monkeypatch.setattr(trainer, "generate_examples", real)
    resumed = train(_settings(log, tmp_path / "run", max_sequences=9, minutes=12.0), target, tokenizer)
    assert resumed.training_sequences == 9 and resumed.steps == 2
    expected = list(itertools.islice(prompt_streams(_settings(log, tmp_path), target, tokenizer).training(0), 9))
    shards = sorted((tmp_path / "run" / "data").glob("shard-*.pt"))
    made = [e.tokens[: e.start].tolist() for shard in shards for e in load_shard(shard)]
    assert made == expected and len(shards) == 3  # the second run went on from the fourth prompt, none repeated
    assert all(len(p) <= 80 for p in made)
    held = [e.tokens[: e.start].tolist() for e in load_shard(tmp_path / "run" / "data" / "held_out.pt")]
    assert not any(p in made for p in held)


def test_train_draft_chat_runs_end_to_end_and_reports_held_out_acceptance(tmp_path, capsys):
    log = tmp_path / "log.json"
    write_log(log, [conversation(i, 2 + i % 2) for i in range(16)])
    args = [str(DEMO_DIR / "target"), "--chat", str(log), "--chat-context", "96", "-o", str(tmp_path / "run"),
            "--minutes", "5", "--data-share", "0.9", "--new-tokens", "16", "--generation-batch", "8", "--held-out",
            "4", "--max-sequences", "8", "--max-steps", "4", "--draft-vocab", "512", "--top-k", "4", "--steps",
            "3", "--batch-size", "8", "--learning-rate", "3e-3", "--threads", "1", "--no-progress"]  # fmt: skip
    settings = settings_from(parser().parse_args(args))
    assert settings.chat == str(log) and settings.text == () and settings.chat_context == 96
    try:
        assert main(args) == 0
    finally:
        threads.forget()
    captured = capsys.readouterr()
    assert "prompts from 16 conversations: " in captured.err and "prompts of at most 80 tokens" in captured.err
    assert "held-out, untrained head: α " in captured.err
    assert "train-draft: 4 steps on 8 sequences; held-out before α " in captured.out and "after α " in captured.out
    report = json.loads((tmp_path / "run" / "training.json").read_text())
    assert report["settings"]["chat"] == str(log) and len(report["latest"]) == 3
    assert main([str(DEMO_DIR / "target"), "--chat", str(tmp_path / "none.json"), "-o", str(tmp_path / "x")]) == 2
    assert "train-draft: error: --chat " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args([str(DEMO_DIR / "target"), "--chat", str(log), "--text", "a", "-o", "out"])

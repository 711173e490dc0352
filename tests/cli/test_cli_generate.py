"""The generate task's ways to print and to batch: `--stream` prints as rounds commit (the same text as
without), `--chat`/`--system` render the prompt with the tokenizer's chat template (what instruct models such
as SmolLM2 need), and `--batch-size` sends a prompt file through N slots (each refilled as its row ends),
prompt by prompt the text the same prompt gives alone (docs/cli.md; docs/design.md rule 7); bad batch values
are refused before models load."""

from __future__ import annotations

import json

import pytest
from cli_fixtures import pair_args, run_main
from demo_pair_fixtures import demo_pair, demo_tokenizer
from transformers import AutoTokenizer, TextStreamer

from assisted_backends.cli import main
from assisted_backends.cli import prompting as prompting_module

PROMPTS = ["The first prompt is", "A second, longer prompt about something else entirely", "Three"]

TEMPLATE = (
    "{% for message in messages %}<|endoftext|>{{ message['role'] }}\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory):
    """The demo pair saved in fp32, its tokenizer given a chat template."""
    target, draft, _ = demo_pair()
    root = tmp_path_factory.mktemp("chat")
    for name, model in (("target", target), ("draft", draft)):
        tokenizer = demo_tokenizer()
        tokenizer.chat_template = TEMPLATE
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def _generate(capsys, root, *extra: str) -> str:
    argv = ["-m", str(root / "target"), "--assistant-model", str(root / "draft"), "--dtype", "fp32"]
    argv += ["--max-new-tokens", "24", "--num-assistant-tokens", "3", "--repetition-penalty", "1.0", *extra]
    assert main(argv) == 0
    return capsys.readouterr().out


def test_stream_prints_the_same_text_as_without(chat_pair, capsys, monkeypatch):
    puts = []
    original = prompting_module.streamer

    def recording(tokenizer):
        streamer = original(tokenizer)
        put = streamer.put
        streamer.put = lambda value: (puts.append(value.reshape(-1).tolist()), put(value))
        return streamer

    monkeypatch.setattr(prompting_module, "streamer", recording)
    plain = _generate(capsys, chat_pair, "--prompt", "def add(a, b):", "--no-stream")
    assert not puts
    streamed = _generate(capsys, chat_pair, "--prompt", "def add(a, b):", "--stream")
    assert streamed == plain and len(puts) > 2  # the prompt, then committed rounds
    assert isinstance(original(AutoTokenizer.from_pretrained(str(chat_pair / "target"))), TextStreamer)


def test_chat_applies_the_template_with_the_system_message(chat_pair, capsys, monkeypatch):
    seen = []
    import assisted_backends.cli.session as session_module

    generate = session_module.Session.generate

    def spy(self, input_ids, *args, **kwargs):
        seen.append(input_ids)
        return generate(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(session_module.Session, "generate", spy)
    out = _generate(capsys, chat_pair, "--prompt", "Say hi", "--system", "Be brief", "--no-stream")
    tokenizer = AutoTokenizer.from_pretrained(str(chat_pair / "target"))
    rendered = tokenizer.decode(seen[0][0])
    assert rendered == "<|endoftext|>system\nBe brief\n<|endoftext|>user\nSay hi\n<|endoftext|>assistant\n"
    assert "Say hi" not in out  # chat mode prints the reply only
    assert (
        main(["-m", str(chat_pair / "target"), "--prompt", "x", "--chat", "--max-new-tokens", "2", "--no-assisted"])
        == 0
    )
    capsys.readouterr()


def test_a_prompt_file_batch_gives_each_prompt_its_own_text(saved_pair, tmp_path, capsys):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS) + "\n\n")  # a blank line is not a prompt
    models = [*pair_args(saved_pair), "--no-stream"]
    alone = []
    for prompt in PROMPTS:
        out = tmp_path / "alone.json"
        code, _, err = run_main(capsys, *models, "--prompt", prompt, "--max-new-tokens", "12", "--json", str(out))
        assert code == 0, err
        alone.append(json.loads(out.read_text())["generated_token_ids"])
    out = tmp_path / "batch.json"
    code, stdout, err = run_main(
        capsys, *models, "--prompt-file", str(prompt_file), "--batch-size", "2", "--max-new-tokens", "12",
        "--json", str(out),
    )  # fmt: skip
    assert code == 0, err
    record = json.loads(out.read_text())
    assert record["generated_token_ids"] == alone, "row by row the same tokens as each prompt alone"
    stats = record["stats"]
    assert stats["batch_size"] == 2 and stats["joins"] == 1, "3 prompts through 2 slots: the third takes a freed one"
    assert stdout.count("--- prompt ") == 3 and "batch of 2" in err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--batch-size", "0"], "error: --batch-size: expected a positive integer, got 0"),
        (
            ["--batch-size", "2", "--stream"],
            "error: --stream streams one sequence, but --batch-size gives 2 rows; drop --stream or generate one prompt "
            "at a time",
        ),
    ],
)
def test_bad_batch_flags_are_refused_before_loading(extra, message, capsys):
    try:
        code = main(["-m", "/nonexistent/model", "--no-assisted", *extra])
    except SystemExit as exit_:  # argparse's own type errors exit with status 2
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err

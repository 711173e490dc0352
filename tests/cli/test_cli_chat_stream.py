"""The CLI generate task: --stream prints as rounds commit (same text as without), --chat/--system
render the prompt with the tokenizer's chat template (what instruct models such as SmolLM2 need)."""

from __future__ import annotations

import pytest
from demo_pair_fixtures import demo_pair, demo_tokenizer
from transformers import AutoTokenizer, TextStreamer

from assisted_backends.cli import main
from assisted_backends.cli import prompting as prompting_module

TEMPLATE = (
    "{% for message in messages %}<|endoftext|>{{ message['role'] }}\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory):
    """The demo pair saved in fp32, its tokenizer given a chat template."""
    target, draft, _ = demo_pair()
    root = tmp_path_factory.mktemp("chat")
    for name, model, template in (("target", target, TEMPLATE), ("draft", draft, TEMPLATE), ("plain", target, None)):
        tokenizer = demo_tokenizer()
        tokenizer.chat_template = template
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def _cli(capsys, root, *extra: str) -> str:
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
    plain = _cli(capsys, chat_pair, "--prompt", "def add(a, b):", "--no-stream")
    assert not puts
    streamed = _cli(capsys, chat_pair, "--prompt", "def add(a, b):", "--stream")
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
    out = _cli(capsys, chat_pair, "--prompt", "Say hi", "--system", "Be brief", "--no-stream")
    tokenizer = AutoTokenizer.from_pretrained(str(chat_pair / "target"))
    rendered = tokenizer.decode(seen[0][0])
    assert rendered == "<|endoftext|>system\nBe brief\n<|endoftext|>user\nSay hi\n<|endoftext|>assistant\n"
    assert "Say hi" not in out  # chat mode prints the reply only
    assert (
        main(["-m", str(chat_pair / "target"), "--prompt", "x", "--chat", "--max-new-tokens", "2", "--no-assisted"])
        == 0
    )
    capsys.readouterr()


def test_chat_without_a_template_is_a_one_line_error(chat_pair, capsys):
    code = main(["-m", str(chat_pair / "plain"), "--prompt", "x", "--chat", "--max-new-tokens", "2", "--no-assisted"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        "error: --chat/--system: this model's tokenizer has no"
    )

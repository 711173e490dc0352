"""`assisted-serve`'s flags: the generate CLI's model, device and drafting flags plus the server's; every
`assisted-serve` command the Dockerfiles and docs/serve.md show parses as written; bad flags stop with one line
before anything loads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from assisted_backends.cli.args import validate
from assisted_backends.serve.cli import model_name, parse_args

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED = [*sorted((ROOT / "docker").glob("*/Dockerfile")), ROOT / "docs" / "serve.md"]


def _commands(path: Path) -> list[list[str]]:
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.lstrip("# ").strip()
        if re.search(r"(^|\s)assisted-serve(\s|$)", line) and not line.startswith(("`", "|", "<!--")):
            words = shlex.split(line, comments=True)
            at = words.index("assisted-serve")
            entrypoint = at > 0 and words[at - 1] == "--entrypoint"  # docker run --entrypoint assisted-serve IMAGE ...
            found.append(words[at + (2 if entrypoint else 1) :])
    return found


def test_documented_commands_parse_as_written():
    commands = [words for path in DOCUMENTED for words in _commands(path)]
    assert len(commands) >= 5
    for words in commands:
        args = parse_args(words)
        validate(args)
        assert args.host in ("127.0.0.1", "0.0.0.0")


def test_flags_and_defaults():
    args = parse_args(["--slots", "3", "--prompt-lookup", "10", "--port", "0"])
    assert (args.slots, args.max_waiting, args.prompt_lookup, args.port, args.host) == (3, 12, 10, 0, "127.0.0.1")
    assert model_name(args) == "demo" and model_name(parse_args(["-m", "/x/SmolLM2.gguf"])) == "SmolLM2.gguf"
    assert model_name(parse_args(["--served-model-name", "m"])) == "m"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--static-shapes"], "--static-shapes"),
        (["--slots", "0"], "--slots"),
        (["--port", "70000"], "--port"),
        (["--chat-template", "/no/such/template.jinja"], "--chat-template"),
        (["--max-new-tokens", "5"], "--max-new-tokens"),
    ],
)
def test_bad_flags_stop_with_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(flags)
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and message in error and "\n" not in error

"""`assisted-serve`'s flags: the generate CLI's model, device and drafting flags plus the server's; every
`assisted-serve` command the Dockerfiles and docs/serve.md show parses as written; bad flags stop with one line
before anything loads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from assisted_backends.serve.cli import model_name, parse_args
from assisted_backends.startup.flags import check_model_flags

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
        check_model_flags(args)
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


def test_docker_examples_publish_the_port_on_loopback_only():
    """`-p 8000:8000` publishes on every interface of the host: the examples bind 127.0.0.1 (the server has no key
    by default)."""
    lines = [line for path in DOCUMENTED for line in path.read_text(encoding="utf-8").splitlines()
             if "docker run" in line and "assisted-serve" in line]  # fmt: skip
    assert len(lines) >= 4
    for line in lines:
        published = re.findall(r"-p\s+(\S+)", line)
        assert published and all(port.startswith("127.0.0.1:") for port in published), line


def test_access_and_limit_flags(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# ops\nk1\n\nk2\n", encoding="utf-8")
    args = parse_args(["--api-key", "k0", "--api-key-file", str(keys), "--cors-origins", "https://a.example",
                       "http://localhost:3000", "--slots", "2", "--send-timeout", "5"])  # fmt: skip
    assert args.api_keys == ["k0", "k1", "k2"] and args.cors_origins == ["https://a.example", "http://localhost:3000"]
    assert args.max_connections == 2 + 8 + 32 and args.send_timeout == 5.0
    assert parse_args([]).api_keys == [] and parse_args([]).cors_origins is None


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--api-key-file", "/no/such/keys"], "--api-key-file"),
        (["--api-key", "two words"], "--api-key"),
        (["--cors-origins", "example.com"], "--cors-origins"),
        (["--send-timeout", "0"], "--send-timeout"),
        (["--max-connections", "0"], "--max-connections"),
    ],
)
def test_bad_access_flags_stop_with_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(flags)
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and message in error and "\n" not in error

"""The Docker images as documented: pinned base images, and header commands that work as written
(no Docker engine here: .ci/lanes/docker_lint.sh runs hadolint, this checks what hadolint cannot)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from assisted_backends.cli.args import build_parser, validate

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "docker").glob("*/Dockerfile"))


def _header_commands(path: Path) -> list[str]:
    """The shell commands in a Dockerfile's leading comments, continuation lines joined."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = re.sub(r"\\\s*\n\s*", " ", "\n".join(lines))
    return [line for line in text.splitlines() if line.startswith("docker run")]


def test_there_are_dockerfiles():
    assert {p.parent.name for p in DOCKERFILES} >= {"cpu", "cuda", "gaudi", "xeon"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned(path):
    text = path.read_text()
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M))
    for image in re.findall(r"^FROM (\S+)", text, flags=re.M):
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image)
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "/" not in tag, f"{path}: unpinned base image {image}"
        assert not image.startswith("intel/intel-optimized-pytorch:2.8"), "Intel published no torch 2.8 tag"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_documented_commands_work_as_written(path):
    parser = build_parser(["auto", "cpu", "cuda", "hpu"])
    for command in _header_commands(path):
        words = shlex.split(command)
        if "numactl" in words and any(w in ("-m", "--membind") for w in words[words.index("numactl") :]):
            assert "--cap-add" in words and "SYS_NICE" in [w.upper() for w in words], command
        if "torch.backends.xeon.run_cpu" in words:
            assert "--no-python" in words, f"run_cpu needs --no-python to start a console script: {command}"
        if "run-assisted-generation" in words:
            args = parser.parse_args(words[words.index("run-assisted-generation") + 1 :])
            validate(args)

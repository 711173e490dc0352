"""Every Python block of README.md and docs/*.md runs as written.

The blocks of one file run in order in one namespace (a page reads as one story), in a temporary working
directory that holds `model.gguf` (a tiny Llama written with the `gguf` package), with the package's cache
there too. A block whose paths are truly the user's is marked on the line before its fence with
`<!-- doc-test: skip REASON -->`; such a block must name a placeholder path (`path/to/`), and no other
block may. Install commands in the same pages keep the editable install (`pip install -e`).
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from gguf_fixtures import write_llama_gguf
from tiny_models import tiny_model

from assisted_backends.demo.corpus import read_corpus
from assisted_backends.demo.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES_WITH_CODE = [page for page in PAGES if "```python" in page.read_text(encoding="utf-8")]
SKIP = re.compile(r"<!--\s*doc-test:\s*skip\s+(?P<reason>.+?)\s*-->")
PLACEHOLDER = "path/to/"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    code: str
    skip_reason: str | None


def python_blocks(page: Path) -> list[Block]:
    """The ```python blocks of a Markdown page, each with the skip reason on the line before its fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        if lines[index].strip() == "```python":
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            marker = SKIP.search(lines[index - 1]) if index else None
            code = "\n".join(lines[index + 1 : end])
            blocks.append(Block(page, index + 1, code, marker.group("reason") if marker else None))
            index = end
        index += 1
    return blocks


@pytest.fixture(scope="module")
def gguf_workdir(tmp_path_factory) -> Path:
    """A directory holding `model.gguf`: a tiny random Llama with a byte-level BPE tokenizer inside."""
    pytest.importorskip("gguf")
    root = tmp_path_factory.mktemp("docs")
    tokenizer = train_tokenizer(read_corpus(60_000)[0], 300)
    model = tiny_model("llama", seed=0, vocab=len(tokenizer), init=0.1)
    write_llama_gguf(model, tokenizer, root / "model.gguf")
    return root


def test_blocks_are_found_and_marked_skips_name_a_user_path():
    blocks = [block for page in PAGES for block in python_blocks(page)]
    readme = [block for block in blocks if block.page.name == "README.md"]
    assert len(readme) >= 4, "the README shows generate, enable + model.generate, a batch and a .gguf"
    entry_points = ["assisted_backends.generate(target", "assisted_backends.enable(", "padding=True", '"model.gguf"']
    for needle in entry_points:
        assert any(needle in block.code for block in readme), f"no README block shows {needle}"
    for block in blocks:
        where = f"{block.page.name}:{block.line}"
        if block.skip_reason is not None:
            assert PLACEHOLDER in block.code, f"{where} is skipped but names no user path: make it run"
        else:
            assert PLACEHOLDER not in block.code, f"{where} names a placeholder path: mark it or make it run"


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda page: page.name)
def test_python_blocks_run(page, gguf_workdir, monkeypatch):
    blocks = [block for block in python_blocks(page) if block.skip_reason is None]
    if not blocks:
        pytest.skip(f"{page.name}: every block is marked (see its reason)")
    monkeypatch.chdir(gguf_workdir)
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(gguf_workdir / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": "__docs__"}
    threads = torch.get_num_threads()
    for block in blocks:
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                exec(compile(block.code, f"{page.name}:{block.line}", "exec"), namespace)  # noqa: S102
        except Exception as error:  # noqa: BLE001 - the message must say which block failed
            pytest.fail(f"{page.name} block at line {block.line} failed: {type(error).__name__}: {error}")
        finally:
            torch.set_num_threads(threads)
        assert "print(" not in block.code or output.getvalue().strip(), f"{page.name}:{block.line} printed nothing"


def test_install_commands_keep_the_editable_install():
    """`pip install ".[gguf]"` replaces an editable install with a copy: every install of this package says -e."""
    installs = re.compile(r"pip install[^\n`]*?(?:\"\.\[|'\.\[|\s\.(?:\s|$)|assisted_backends\[)")
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for found in installs.finditer(line):
                assert " -e " in found.group(0) + " ", f"{page.name}:{number}: {line.strip()}"

"""The README's examples show what they claim: the first Python block's draft is accepted, the page
says when the adaptive schedule turns a draft off, and the API section names how threads are chosen."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from test_docs_code import python_blocks

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.usefixtures("one_thread")
def test_the_first_python_block_prints_an_accepted_draft():
    first = python_blocks(README)[0]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(first.code, f"{README.name}:{first.line}", "exec"), {})
    rate = float(printed.getvalue().split()[-1])
    assert rate > 0.2, f"the first block's acceptance_rate is {rate}: {printed.getvalue()[-300:]!r}"


def test_the_readme_explains_the_adaptive_schedule_and_the_thread_choice():
    text = README.read_text(encoding="utf-8")
    api = text[text.index("## Python API") :]
    assert re.search(r'"adaptive".{0,200}drafts nothing', api, re.S)
    assert "assisted_backends.set_threads(n)" in api and "threads=n" in api
    assert len(text.splitlines()) <= 250

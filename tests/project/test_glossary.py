"""One meaning per word (docs/design.md's glossary): the meanings retired by issue 40 stay retired.

A batch index is a `slot` (never a `position`, which is a token's index in its sequence); the slots still
generating are `Slots.live()` (the batch's one owner, `engine.slots`; no `LiveRows` beside it); "batch position" is gone
from the code and the pages. Each test greps the package (and the docs) and names every line that brings a
retired meaning back.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "assisted_backends"
GLOSSARY_TERMS = ("round", "plain round", "step", "row", "slot", "live rows", "column", "position", "committed token",
                  "pending token")  # fmt: skip
# the methods that act on one row of a batch: their batch index is `slot`
ROW_METHODS = ("insert_row", "set_row", "set_row_pad", "write_row", "row_tokens", "finish_row", "place_row", "row_view",
               "join", "copy_row_from", "prefill_row")  # fmt: skip


def _sources() -> dict[Path, str]:
    return {path: path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def _hits(pattern: str, texts: dict[Path, str], flags: int = 0) -> list[str]:
    found = []
    for path, text in texts.items():
        for match in re.finditer(pattern, text, flags):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)[:80]!r}")
    return found


def test_a_batch_index_is_a_slot_not_a_position() -> None:
    signature = r"def (?:" + "|".join(ROW_METHODS) + r")\([^)]*\bposition\b"
    assert _hits(signature, _sources(), re.S) == []
    assert _hits(r"\.positions\(\)", _sources()) == []


def test_the_slots_still_generating_are_the_slots_own() -> None:
    sources = _sources()
    assert _hits(r"\bstate\.rows\b|\bclass LiveRows\b|\bclass TokenBuffer\b", sources) == []
    assert _hits(r"\bclass Slots\b", sources), "Slots moved: update this test with it"


def test_batch_position_is_gone_from_the_code_and_the_pages() -> None:
    pages = {path: path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    retired = _hits(r"batch position", {**_sources(), **pages}, re.I)
    allowed = [hit for hit in retired if "docs/design.md" in hit and "meanings retired" in _line(hit)]
    assert [hit for hit in retired if hit not in allowed] == []


def test_the_glossary_defines_each_word_once() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    glossary = design[design.index("## Glossary") :]
    terms = re.findall(r"^\| ([^|]+?) \|", glossary, re.M)
    for term in GLOSSARY_TERMS:
        assert terms.count(term) == 1, f"the glossary should define {term!r} once: {terms}"


def _line(hit: str) -> str:
    path, line = hit.split(":")[:2]
    return (ROOT / path).read_text().splitlines()[int(line) - 1]

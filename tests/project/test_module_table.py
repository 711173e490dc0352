"""docs/design.md's module table names every module of the package, and only modules that exist.

The table ("## Modules", one row per module: its path in backticks, then its job) is where a reader starts; a module
missing from it is a room nobody was shown, a row whose module is gone sends the reader to nothing. `__init__.py`
and `__main__.py` files hand names on or start a command: they are not rows.
"""

from __future__ import annotations

import re
from pathlib import Path

import assisted_backends

PACKAGE = Path(assisted_backends.__file__).parent
DESIGN = PACKAGE.parent / "docs" / "design.md"
ROW = re.compile(r"^\| `(?P<path>[a-z_0-9/]+\.py)` \|", re.MULTILINE)


def package_modules() -> set[str]:
    """Every module file of the package, relative to it (`engine/loop.py`), entry points and package faces aside."""
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    }


def table_rows() -> list[str]:
    """The module paths of the table's rows, in order (the "## Modules" section only)."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return [match["path"] for match in ROW.finditer(section)]


def test_every_module_has_a_row():
    missing = sorted(package_modules() - set(table_rows()))
    assert not missing, f"docs/design.md's module table lacks a row for: {missing}"


def test_every_row_names_a_module_once():
    rows = table_rows()
    gone = sorted(set(rows) - package_modules())
    twice = sorted({row for row in rows if rows.count(row) > 1})
    assert not gone, f"docs/design.md's module table names modules that do not exist: {gone}"
    assert not twice, f"docs/design.md's module table names these twice: {twice}"


def test_the_reader_finds_rows_and_misses(tmp_path):
    """The table reader sees rows and only rows: a prose mention of a module is not a row."""
    section = "## Modules\n\n| `engine/loop.py` | the loop |\n\nSee `engine/round.py` for a round.\n\n## Next\n"
    assert [match["path"] for match in ROW.finditer(section)] == ["engine/loop.py"]
    assert "engine/loop.py" in package_modules() and "engine/__init__.py" not in package_modules()

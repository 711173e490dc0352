"""docs/cli.md says what `run-assisted-generation --help` says: every choice list, every
default, and how the thread count is chosen."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from assisted_backends.cli.args import build_parser
from assisted_backends.startup.flags import device_names

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
PARSER = build_parser(device_names())
ACTIONS = [action for action in PARSER._actions if action.option_strings and action.dest != "help"]


def _rows(action: argparse.Action) -> str:
    """The docs/cli.md flag-table rows that name one of the action's flags (`-m/--model`, `--dtype ...`)."""
    names = "|".join(re.escape(flag) for flag in action.option_strings)
    pattern = re.compile(rf"[`/](?:{names})(?![\w-])")
    return "\n".join(line for line in DOC.splitlines() if line.startswith("|") and pattern.search(line))


def _long(action: argparse.Action) -> str:
    return next((flag for flag in action.option_strings if flag.startswith("--")), action.option_strings[0])


def test_every_flag_has_a_row():
    missing = [_long(action) for action in ACTIONS if not _rows(action)]
    assert not missing, f"flags docs/cli.md does not list: {missing}"


@pytest.mark.parametrize("action", [a for a in ACTIONS if a.choices], ids=_long)
def test_every_choice_list_is_the_programs(action):
    listed = "{" + ",".join(str(choice) for choice in action.choices) + "}"
    rows = _rows(action)
    assert f"`{_long(action)} {listed}`" in rows, f"docs/cli.md: {_long(action)} should list {listed}; it has {rows}"


@pytest.mark.parametrize(
    "action",
    [a for a in ACTIONS if a.default not in (None, False, argparse.SUPPRESS) and a.nargs != 0],
    ids=_long,
)
def test_every_default_is_the_programs(action):
    default = f"{action.default:g}" if isinstance(action.default, float) else str(action.default)
    rows = _rows(action)
    assert re.search(rf"default[^|]*?`?{re.escape(default)}`?", rows), (
        f"docs/cli.md: {_long(action)} defaults to {default}; its row says: {rows}"
    )


def test_the_thread_default_is_described_as_measured_in_both():
    threads = next(a for a in ACTIONS if _long(a) == "--threads")
    assert "measured" in threads.help and "measured" in _rows(threads)
    assert "lowered" in threads.help and "lowered" in _rows(threads)

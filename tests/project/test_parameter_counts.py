"""Planning takes few parameters: no function of `api/plan.py`, `api/run.py` or `options/` takes more than
`MOST_PARAMETERS` (positional, keyword-only, `*args` and `**kwargs` each count; `self` and `cls` do not).

A call reaches planning as one `GenerationRequest` (`options.request`) and the models as one object: a function
that needs more than a handful of values is missing a type that holds them (`plan_generation` once took 17)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import assisted_backends

PACKAGE = Path(assisted_backends.__file__).parent
PLANNING = sorted([PACKAGE / "api" / "plan.py", PACKAGE / "api" / "run.py", *(PACKAGE / "options").glob("*.py")])
MOST_PARAMETERS = 6


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The names of `function`'s parameters, `self` and `cls` left out."""
    arguments = function.args
    names = [argument.arg for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
    names += [argument.arg for argument in (arguments.vararg, arguments.kwarg) if argument is not None]
    return [name for name in names if name not in ("self", "cls")]


def too_many(source: str, most: int = MOST_PARAMETERS) -> list[str]:
    """'name (count)' of each function or method in `source` with more than `most` parameters."""
    nodes = ast.walk(ast.parse(source))
    functions = sorted((node for node in nodes if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)),
                       key=lambda node: node.lineno)  # fmt: skip
    return [f"{node.name} ({len(parameters(node))})" for node in functions if len(parameters(node)) > most]


@pytest.mark.parametrize("path", PLANNING, ids=lambda path: path.relative_to(PACKAGE).as_posix())
def test_planning_functions_take_at_most_six_parameters(path):
    assert too_many(path.read_text(encoding="utf-8")) == []


def test_the_count_sees_every_kind_of_parameter():
    source = (
        "class A:\n"
        "    def method(self, a, b, c, d, e, f): ...\n"
        "    def wide(self, a, /, b, *args, c, **kwargs): ...\n"
        "def plain(a, b, c, d, e, f, g): ...\n"
        "def keywords(a, *, b, c, d, e, f, g): ...\n"
        "def star(a, b, c, d, e, *args, **kwargs): ...\n"
        "async def waits(a, b, c, d, e, f, g): ...\n"
    )
    assert too_many(source) == ["plain (7)", "keywords (7)", "star (7)", "waits (7)"]
    assert too_many(source, most=4) == ["method (6)", "wide (5)", "plain (7)", "keywords (7)", "star (7)", "waits (7)"]

"""Every refusal of a call's planning comes from the one table (`options.fields`): the modules that plan a call
raise no message of their own, every key of `REFUSALS` is raised somewhere and every key raised is in it, the
range checks the table names exist, and what builds and runs a plan refuses nothing (planning did). The
`raise OptionError(` left outside `options/` are listed here, each with the reason it stays where it is."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import assisted_backends
from assisted_backends.options import errors, fields, ranges

PACKAGE = Path(assisted_backends.__file__).parent
# The modules a call's planning runs (`api.plan.plan_generation` and what it calls to decide), the CLI's shared
# checks (`options.ranges`) among them: each raise in them is `raise refusal(...)`, from the table.
PLANNING = (
    "api/plan.py", "api/generation.py", "api/queue.py", "drafters/factory.py", "options/resolve.py",
    "options/ranges.py", "options/prompt.py", "options/criteria.py", "options/processors.py",
)  # fmt: skip
# `raise OptionError(` outside `options/`, left where they are deliberately: (file, reason).
LEFT_OUTSIDE = {
    "backends/base.py": "a backend's own options (device, dtype, bucket size): checked where the backend is resolved",
    "backends/registry.py": "the device name: the registry knows which backends exist on this machine",
    "backends/cpu/precision.py": "a dtype the CPU cannot run natively: needs the CPU's features",
    "backends/hpu/backend.py": "HPU-only options: the Habana stack is imported only there",
    "drafters/eagle/build.py": "an EAGLE head against its target (vocabulary, width, the input embedding it "
    "borrows): `check_head`, called by planning (`drafters.factory.plan_drafting`) from the target's facts",
    "drafters/eagle/precision.py": "an EAGLE head's precision name: the head's own module",
    "startup/pair.py": "command lines only: --head-precision without a head, found when the flags' models open",
}


def _source(relative: str) -> str:
    return (PACKAGE / relative).read_text(encoding="utf-8")


def _raises(relative: str) -> list[ast.Raise]:
    return [node for node in ast.walk(ast.parse(_source(relative))) if isinstance(node, ast.Raise)]


def _called(node: ast.Raise) -> str | None:
    """The name a `raise name(...)` calls (None: a bare re-raise or a raise of a variable)."""
    if isinstance(node.exc, ast.Call):
        function = node.exc.func
        return function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
    return None


@pytest.mark.parametrize("relative", PLANNING)
def test_planning_modules_raise_only_refusals_of_the_table(relative):
    own = [
        f"{relative}:{node.lineno} raise {_called(node)}(...)"
        for node in _raises(relative)
        if node.exc is not None and _called(node) != "refusal"
    ]
    assert own == [], "a refusal written inline instead of in options.fields.REFUSALS"


def test_every_key_of_the_table_is_raised_and_every_key_raised_is_in_it():
    raised: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        raised.update(re.findall(r"refusal\(\s*\"([a-z_]+)\"", path.read_text(encoding="utf-8")))
    assert raised - set(fields.REFUSALS) == set(), "raised but not in the table"
    assert set(fields.REFUSALS) - raised == set(), "in the table but never raised"


@pytest.mark.parametrize("key", list(fields.REFUSALS))
def test_each_refusal_is_one_line_naming_an_option(key):
    kind, template = fields.REFUSALS[key]
    assert kind in errors.KINDS and "\n" not in template
    assert re.search(r"\{[a-z_]+\}", template), "names no option"
    slots = set(re.findall(r"\{([a-z_0-9]+)\}", template))
    error = errors.refusal(key, {slot: 7 for slot in slots if slot not in ("name", "shapes", "rows")},
                           name="max_new_tokens", shapes="static_shapes", rows="input_ids")  # fmt: skip
    assert "{" not in str(error) and isinstance(error, errors.KINDS[kind])


def test_the_range_checks_the_table_names_are_the_ones_that_refuse():
    refusing = {
        node.name
        for node in ast.parse(_source("options/ranges.py")).body
        if isinstance(node, ast.FunctionDef) and any(isinstance(n, ast.Raise) for n in ast.walk(node))
    }
    assert refusing == set(fields.RANGE_CHECKS)
    assert all(callable(getattr(ranges, name)) for name in fields.RANGE_CHECKS)


def test_option_errors_raised_outside_options_are_the_ones_left_deliberately():
    found: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("options/"):
            continue
        if "raise OptionError(" in path.read_text(encoding="utf-8"):
            found.add(relative)
    assert found == set(LEFT_OUTSIDE)
    assert not found & set(PLANNING)


def test_building_and_running_a_plan_refuses_nothing():
    """What planning accepted runs: the drafter's builder and `run` raise no refusal of options (a refusal there
    would come after the models were prepared)."""
    factory = ast.parse(_source("drafters/factory.py"))
    build = next(node for node in factory.body if isinstance(node, ast.FunctionDef) and node.name == "build_drafter")
    assert [node.lineno for node in ast.walk(build) if isinstance(node, ast.Raise)] == []
    assert [node.lineno for node in _raises("api/run.py")] == []


def test_the_rules_module_and_the_table_import_no_torch():
    code = (
        "import sys; from assisted_backends.options import errors, fields, ranges; "
        "from assisted_backends.cli import args, preflight; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

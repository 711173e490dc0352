"""The round's and the runner's interfaces, held to what issue 40 wrote down: a change to either updates this test
on purpose.

A round is `speculative_round(state, γ)` (everything else it reads is the `DecodingState`); the engine types the
target against the `Runner` protocol (`engine/runner.py`), which a different model implementation (the native
decoder, a graph-captured step) satisfies without the engine knowing which; the package's `ModelRunner` keeps the
protocol's methods with the same arguments. No engine module but `runner.py` names `ModelRunner`, the runner reads
no backend's attribute (`prepared_from`), and the EAGLE feature tap goes through `Runner.tap_features`.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import assisted_backends
from assisted_backends.engine import round as engine_round
from assisted_backends.engine.acceptance import Verification
from assisted_backends.engine.runner import ModelRunner, Runner
from assisted_backends.engine.state import DecodingState

PACKAGE = Path(assisted_backends.__file__).parent
ROUND_PARAMETERS = ["state", "gamma"]
RUNNER_METHODS = {
    "forward": ["self", "tokens", "last_only", "hidden_only"],
    "forward_tree": ["self", "tokens", "tree"],
    "keep_path": ["self", "begin", "queries"],
    "tree_refusal": ["self"],
    "rollback": ["self", "length"],
    "move_rows": ["self", "move", "length"],
    "row_pass": ["self", "prompt", "width", "pad_id"],
    "insert_row": ["self", "slot", "row", "begin", "keep"],
    "tap_features": ["self", "tap"],
}
RUNNER_ATTRIBUTES = {"length", "forward_count", "resizable", "head"}
STATE_FIELDS = [
    "slots", "target", "drafter", "selector", "generator", "settings", "stats", "schedule", "split", "tree_price",
]  # fmt: skip


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_a_round_takes_the_state_and_gamma():
    assert parameters(engine_round.speculative_round) == ROUND_PARAMETERS
    assert parameters(engine_round.prefill) == ["state"]


def test_verify_returns_one_shape():
    for function in (engine_round.verify, engine_round.verify_tree):
        assert inspect.signature(function).return_annotation in ("Verification", Verification), function.__name__


def test_the_state_holds_what_a_round_reads():
    assert [field for field in DecodingState.__dataclass_fields__] == STATE_FIELDS


def protocol_methods() -> dict[str, list[str]]:
    return {
        name: parameters(member)
        for name, member in vars(Runner).items()
        if callable(member) and not name.startswith("_")
    }


def test_the_runner_protocol_is_the_written_list():
    assert protocol_methods() == RUNNER_METHODS
    assert set(Runner.__annotations__) == RUNNER_ATTRIBUTES


@pytest.mark.parametrize("method", sorted(RUNNER_METHODS))
def test_the_model_runner_keeps_the_protocols_arguments(method):
    assert parameters(getattr(ModelRunner, method)) == RUNNER_METHODS[method]


def test_the_model_runner_has_the_protocols_attributes():
    for name in RUNNER_ATTRIBUTES - {"forward_count", "head"}:  # set in __init__; these two are properties
        assert isinstance(getattr(ModelRunner, name), property), name


def imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
    return names


def test_no_engine_module_but_the_runners_own_names_the_model_runner():
    naming = [path.name for path in sorted((PACKAGE / "engine").glob("*.py")) if "ModelRunner" in imported_names(path)]
    assert naming == [], naming


def test_the_runner_reads_no_backend_attribute_and_the_tap_is_a_method():
    assert "prepared_from" not in (PACKAGE / "engine" / "runner.py").read_text(encoding="utf-8")
    build = (PACKAGE / "drafters" / "eagle" / "build.py").read_text(encoding="utf-8")
    assert ".feature_tap =" not in build and ".tap_features(" in build

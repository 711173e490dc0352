"""pytest plugin for the transformers-generation lane (`.ci/lanes/transformers_generation.sh`).

Loaded with `-p hf_lane_plugin` while pytest runs inside transformers' own test tree (fetched by
`fetch_tests.py`), never by this project's default suite. It

- keeps only the tests `GenerationTesterMixin` defines (`--hf-lane-all` keeps every collected test);
- with `--hf-lane-mode=routed`, routes every `model.generate(...)` of a model built during a test through
  `assisted_backends.enable(model)`: `GenerationMixin.generate` is wrapped for the test's duration, and the
  first call on an instance enables it (later calls reach the package directly). Models built by other
  models' `generate` (transformers' own assisted decoding) are never reached: the package runs them;
- counts, per test, the routed calls and the package's refusals, and writes them to the JUnit XML as
  properties (`routed_calls`, `refusal`);
- with `--hf-lane-refusals` (on in routed mode by default), turns a failure whose exception matches a
  documented refusal of `refusals.py` (test-name pattern + exception pattern) into an xfail with that
  reason; anything else that fails stays a failure.

`--hf-lane-mode=plain` runs the same selection without the package (the baseline).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import refusals as refusal_list  # noqa: E402


def pytest_addoption(parser):
    group = parser.getgroup("hf-lane", "assisted_backends transformers-generation lane")
    group.addoption("--hf-lane-mode", choices=("plain", "routed"), default="routed")
    group.addoption("--hf-lane-all", action="store_true", help="keep every test, not only GenerationTesterMixin's")
    group.addoption(
        "--hf-lane-no-refusals", action="store_true", help="report documented refusals as failures, not xfails"
    )


def _mixin():
    from tests.generation.test_utils import GenerationTesterMixin

    return GenerationTesterMixin


def pytest_collection_modifyitems(config, items):
    if config.getoption("--hf-lane-all"):
        return
    mixin = _mixin()
    keep, drop = [], []
    for item in items:
        cls = getattr(item, "cls", None)
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        ours = cls is not None and issubclass(cls, mixin) and name in vars(mixin)
        (keep if ours else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.fixture(autouse=True)
def _hf_lane_route(request, monkeypatch):
    """Routed mode: `model.generate` of every model of the test goes through assisted_backends.enable."""
    state = {"calls": 0, "refusals": []}
    request.node._hf_lane_state = state
    if request.config.getoption("--hf-lane-mode") != "routed":
        yield
        return
    from transformers.generation.utils import GenerationMixin

    import assisted_backends

    original = GenerationMixin.generate

    def routed_generate(self, *args, **kwargs):
        assisted_backends.enable(self)
        state["calls"] += 1
        try:
            return self.__dict__["generate"](*args, **kwargs)
        except (NotImplementedError, ValueError, TypeError) as error:
            state["refusals"].append(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            raise

    monkeypatch.setattr(GenerationMixin, "generate", routed_generate)
    yield
    monkeypatch.setattr(GenerationMixin, "generate", original)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    state = getattr(item, "_hf_lane_state", None)
    if report.when == "call" and state is not None:
        item.user_properties.append(("routed_calls", state["calls"]))  # junitxml writes the item's at teardown
        for refusal in state["refusals"][:1]:
            item.user_properties.append(("first_exception", refusal))
    config = item.config
    if (
        report.failed
        and call.excinfo is not None
        and config.getoption("--hf-lane-mode") == "routed"
        and not config.getoption("--hf-lane-no-refusals")
    ):
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        reason = refusal_list.documented(name, call.excinfo.type, str(call.excinfo.value))
        if reason is not None:
            report.outcome = "skipped"
            report.wasxfail = f"documented refusal: {reason}"

"""How many of the package's modules the server's startup runs: from its flags to its engine built, traced.

`assisted-serve`'s startup up to serving (its flags parsed and checked: `serve.cli.parse_args`, `check`; the models
opened and the engine built: `serve.server.build_state`) on the shipped demo pair, on the CPU, with one thread (no
thread probe): every `assisted_backends/` file with a Python frame is counted (`sys.setprofile`). As in
test_module_trace, the traced startup is the second one: the first imports modules, and the count is about the
code the startup runs, not the imports. The walk goes down: the server calls the shared startup (`startup.pair`),
which opens each model through the loading room (`loading.open`) and builds on the API (`AssistedGenerator`).
"""

from __future__ import annotations

import pytest
from test_module_trace import executed_modules

# Issue 50 aimed at 12; unreachable for a startup that checks its flags against the files, resolves a backend, opens
# two models and builds the engine: 36 when first traced (serve/ 10, startup/ 7, backends/ 6, loading/ 3, api/ 2,
# eagle's checkpoint probe and head check, the demo pair, the launch check, options.ranges, hf_compat, model_facts,
# extras, quantized.linear), none of them in cli/; 37 once the server decides whether its prefix cache is exact for the
# model (api/prefix.py).
MODULE_BOUND = 37
FLAGS = ["--threads", "1", "--port", "0"]

pytestmark = pytest.mark.usefixtures("one_thread")


def startup_modules() -> list[str]:
    """The package files with a Python frame while the server starts (flags, checks, models, engine)."""
    from assisted_backends.serve.cli import check, model_name, parse_args
    from assisted_backends.serve.server import build_state

    built = []

    def start() -> None:
        args = parse_args(FLAGS)
        check(args)
        built.append(build_state(args, model_name(args)))

    seen = executed_modules(start)
    state, line = built[0]
    assert state.engine is not None and "slots" in line
    return sorted(seen)


@pytest.fixture(scope="module")
def walked() -> list[str]:
    pytest.importorskip("fastapi")
    from assisted_backends.demo.pair import shipped_pair

    if shipped_pair() is None:
        pytest.skip("the demo pair's weights are not shipped in this checkout")
    startup_modules()  # imports
    return startup_modules()


def test_the_server_starts_through_few_modules(walked):
    assert len(walked) <= MODULE_BOUND, f"{len(walked)} modules: {walked}"


def test_the_server_starts_without_the_command_line(walked):
    assert not [module for module in walked if module.startswith("cli/")], walked
    assert "loading/open.py" in walked and "startup/pair.py" in walked

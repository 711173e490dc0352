import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# The helpers here (tiny_models, ...) and every folder's test modules, which share fixtures across folders
# (`from test_batches import prompts`): tests/<folder> mirrors assisted_backends/<folder>.
sys.path.insert(0, HERE)
for folder in sorted(os.listdir(HERE)):
    path = os.path.join(HERE, folder)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "__init__.py")):
        sys.path.append(path)
torch.set_num_threads(min(2, torch.get_num_threads()))
from assisted_backends.api.threads import set_threads  # noqa: E402

set_threads(torch.get_num_threads())  # fixed for the suite: no test's first generate call probes its threads
from assisted_backends.native import extension  # noqa: E402

extension.status()  # build (once per machine) or load the package's kernels before any test moves the cache dir


@pytest.fixture(autouse=True)
def _no_opened_models_between_tests():
    """Models opened by name are kept per process (`loading.open.opened_model`); each test starts without them."""
    yield
    from assisted_backends.loading.open import forget_opened_models

    forget_opened_models()


@pytest.fixture(autouse=True)
def _deterministic_seed():
    torch.manual_seed(1234)


@pytest.fixture
def one_token_matches(monkeypatch):
    """Prompt lookup from one-token matches too (the drafter's default asks for two): a random model's
    output seldom repeats two prompt tokens in a row, and these tests need lookups to be verified."""
    from assisted_backends.drafters import prompt_lookup

    monkeypatch.setattr(prompt_lookup, "DEFAULT_MIN_NGRAM", 1)


@pytest.fixture
def tree_passes(monkeypatch) -> list[int]:
    """Counts the rounds that verified a token tree (the real `verify_tree` runs)."""
    from assisted_backends.engine import round as engine_round

    counted: list[int] = []
    real = engine_round.verify_tree

    def counting(*args, **kwargs):
        counted.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_round, "verify_tree", counting)
    return counted


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests on one thread: tiny models gain nothing from a second, and the machines
    running the tests are shared. Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

"""How many of the package's modules one call runs: a greedy call with a draft model, traced.

Every `assisted_backends/` file with a Python frame during `generate(target, ids, assistant_model=draft,
max_new_tokens=8)` on a tiny Llama pair, on the CPU, is counted (`sys.setprofile`). The traced call is
the second one: the first imports modules, and the count is about the code a call runs, not the imports.
Each detour this test names once ran on that call: the CUDA and HPU backends on a CPU run, the EAGLE
builder for a plain draft model, the quantized layers for a model that is not quantized; the CPU's
features, precision, IPEX, thread placement and thread count probed again on every call; the multi-rank
agreement in a single process; the model loader for models already in memory; stopping criteria built
when none were asked for; training flags saved and restored when no module trains.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_model

import assisted_backends
from assisted_backends import generate

PACKAGE = Path(assisted_backends.__file__).parent
# 38 when first traced (39 once api/threads.py joined the call), 35 without the first three detours below, 37
# once engine/ split its loop (round.py, rows.py), 26 without the other detours (14 outside engine/, 12 in it),
# still 26 once the round took one decoding state (engine/state.py, which took in rows.py: issue 40)
MODULE_BOUND = 26
DETOURS = (
    "backends/cuda/backend.py",
    "backends/hpu/backend.py",
    "drafters/eagle/build.py",
    "quantized/linear.py",
    "backends/cpu/cpu_features.py",
    "backends/cpu/precision.py",
    "backends/cpu/ipex.py",
    "backends/cpu/affinity.py",
    "extras.py",
    "api/threads.py",
    "distributed/agreement.py",
    "loading/models.py",
    "options/criteria.py",
    "api/model_state.py",
)

pytestmark = pytest.mark.usefixtures("one_thread")


def executed_modules(call) -> set[str]:
    """The package files (relative to the package) with a Python frame while `call()` runs."""
    seen: set[str] = set()
    root = str(PACKAGE)

    def profile(frame, event, arg) -> None:
        name = frame.f_code.co_filename
        if name.startswith(root):
            seen.add(Path(name).relative_to(PACKAGE).as_posix())

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


@pytest.fixture(scope="module")
def greedy_call_modules() -> set[str]:
    target, draft = tiny_model("llama", 0), tiny_model("llama", 1)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))

    def call() -> None:
        generate(target, ids, assistant_model=draft, max_new_tokens=8)

    with pytest.MonkeyPatch.context() as patch:  # the default call: the IPEX lane turns IPEX on for every model
        patch.setenv("ASSISTED_BACKENDS_IPEX", "auto")
        call()  # imports
        return executed_modules(call)


def test_a_greedy_call_with_a_draft_model_runs_few_modules(greedy_call_modules):
    modules = sorted(greedy_call_modules)
    assert len(modules) <= MODULE_BOUND, f"{len(modules)} modules: {modules}"


@pytest.mark.parametrize("detour", DETOURS)
def test_a_greedy_call_takes_no_detour(greedy_call_modules, detour):
    assert detour not in greedy_call_modules


def test_a_cpu_call_imports_no_cuda_or_hpu_backend_module():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the CUDA backend is rightly probed")
    code = (
        "import sys, torch; sys.path.insert(0, 'tests'); from tiny_models import tiny_model; "
        "from assisted_backends import generate; "
        "generate(tiny_model('llama', 0), torch.zeros(1, 4, dtype=torch.long), "
        "assistant_model=tiny_model('llama', 1), max_new_tokens=2); "
        "print(sorted(m for m in sys.modules if m.startswith(('assisted_backends.backends.cuda', "
        "'assisted_backends.backends.hpu'))))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def test_the_call_to_the_first_verified_token_runs_through_few_files():
    """From `generate` to the target's first verify pass, the stack passes through at most 6 of the package's
    files: a reader follows the call by opening those (planning and resolving options are calls that return a
    frozen value on the way, not layers the call runs inside)."""
    target, draft = tiny_model("llama", 0), tiny_model("llama", 1)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    root = str(PACKAGE)
    stacks: list[list[str]] = []

    def profile(frame, event, arg) -> None:
        if event != "call" or stacks or frame.f_code.co_name != "forward":
            return
        files, caller = [], frame
        while caller is not None:
            if caller.f_code.co_filename.startswith(root):
                files.append(Path(caller.f_code.co_filename).relative_to(PACKAGE).as_posix())
                if caller.f_code.co_name == "verify":  # the target's forward inside a round's verify pass
                    stacks.append(files)
            caller = caller.f_back

    sys.setprofile(profile)
    try:
        generate(target, ids, assistant_model=draft, max_new_tokens=8, num_assistant_tokens_schedule="constant")
    finally:
        sys.setprofile(None)
    assert stacks, "no verify pass was traced"
    files = list(dict.fromkeys(reversed(stacks[0])))
    assert files[0] == "api/generation.py" and files[-1] == "engine/runner.py", files
    assert len(files) <= 6, files

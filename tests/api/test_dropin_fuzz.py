"""Seeded differential fuzzing of `assisted_backends.enable(model)`: random `model.generate(...)` calls
against transformers' own `generate` on an identical twin (`dropin_fuzz`).

Lean default: `ASSISTED_BACKENDS_FUZZ_CASES` cases (default 96) of seed `ASSISTED_BACKENDS_FUZZ_SEED`, one
test each, so a failure names its case and prints the call that reproduces it. The long run
(`-m slow`, `ASSISTED_BACKENDS_FUZZ_LONG` cases, default 1000) draws further cases and reports every failing
one grouped by class.
"""

from __future__ import annotations

import os
from collections import defaultdict

import dropin_fuzz
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")

SEED = dropin_fuzz.seed_from_env()
CASES = int(os.environ.get("ASSISTED_BACKENDS_FUZZ_CASES", "96"))
LONG_CASES = int(os.environ.get("ASSISTED_BACKENDS_FUZZ_LONG", "1000"))


@pytest.mark.parametrize("index", range(CASES))
def test_dropin_matches_transformers(index):
    case = dropin_fuzz.draw_case(SEED, index)
    outcome = dropin_fuzz.run_case(case)
    assert not outcome.failed, f"{outcome.verdict}: {outcome.detail}\n{dropin_fuzz.describe(case)}"


def test_cases_are_replayable():
    """The same (seed, index) gives the same case, different indices different cases."""
    assert dropin_fuzz.draw_case(SEED, 3) == dropin_fuzz.draw_case(SEED, 3)
    assert len({dropin_fuzz.describe(dropin_fuzz.draw_case(SEED, i)) for i in range(20)}) == 20


def test_a_documented_refusal_is_told_apart_from_an_undocumented_one():
    assert dropin_fuzz.documented_reason(
        NotImplementedError("output_attentions=True is not supported by assisted_backends: ...")
    )
    assert dropin_fuzz.documented_reason(ValueError("max_new_tokens is required")) is None
    assert dropin_fuzz.documented_reason(NotImplementedError("output_scores=True is not supported")) is None


@pytest.mark.slow
def test_long_fuzz_run():
    failures = defaultdict(list)
    for index in range(CASES, CASES + LONG_CASES):
        case = dropin_fuzz.draw_case(SEED, index)
        outcome = dropin_fuzz.run_case(case)
        if outcome.failed:
            failures[dropin_fuzz.failure_class(case, outcome)].append((case, outcome))
    report = []
    for name, found in sorted(failures.items(), key=lambda item: -len(item[1])):
        case, outcome = found[0]
        report.append(f"{len(found)} x {name}\n  e.g. {outcome.detail[:300]}\n{dropin_fuzz.describe(case)}")
    assert not failures, f"{sum(map(len, failures.values()))} of {LONG_CASES} cases failed:\n\n" + "\n\n".join(report)

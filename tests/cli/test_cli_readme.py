"""What the README and the help text claim agrees with the code: the adaptive γ cap and default (help, README,
docs/api.md), the smoke pair's notice and the demo pair's retraining time, a short README whose claims carry
their conditions, and its test command that deselects the long tests a lane runs."""

from __future__ import annotations

import ast
import re

from cli_fixtures import ROOT, run_cli

from assisted_backends.cli import args as cli_args
from assisted_backends.options import fields


def test_help_and_readme_state_the_adaptive_cap_the_code_uses():
    """The γ defaults are written once (`options.fields`), planning and the CLI's help both read them."""
    help_text = " ".join(cli_args.build_parser(["auto"]).format_help().split())
    assert f"picks γ from 0 to {fields.MAX_ADAPTIVE_GAMMA}" in help_text
    assert f"uses {fields.DEFAULT_NUM_ASSISTANT_TOKENS}" in help_text
    api = " ".join((ROOT / "docs" / "api.md").read_text().split())
    assert f"`num_assistant_tokens` or {fields.MAX_ADAPTIVE_GAMMA}" in api


def test_smoke_pair_says_what_it_is_and_retraining_time_agrees_with_the_readme():
    """(test_cli.py's console-script demo run checks the smoke pair's notice on a real run.)"""
    from assisted_backends.startup.choice import SMOKE_NOTICE

    assert "SMOKE" in SMOKE_NOTICE and "standard library" not in SMOKE_NOTICE
    help_minutes = re.search(r"about (\d+)\s+minutes", " ".join(run_cli("--help").stdout.split())).group(1)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"about {help_minutes} minutes on 2 idle cores" in readme


def test_readme_stays_short_and_its_claims_carry_their_conditions():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    flat = " ".join(readme.split())
    assert "--repetition-penalty 1.2" not in flat or "applies" in flat  # the CLI applies it to the demo pair
    assert "load" in flat.split("The main job", 1)[1][:600], "the main job's time must say the load it was taken at"


def test_default_suite_deselects_the_long_tests_and_a_lane_runs_them():
    readme = (ROOT / "README.md").read_text()
    command = readme.split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert '-m "not slow' in command  # "not slow" or "not slow and not distributed"
    assert "-m slow" in (ROOT / ".ci" / "lanes" / "long_tests.sh").read_text()
    long_tests = {  # the chi-square tests that took 27-45 s each on a busy 2-core machine
        "engine/test_lossless_sampling.py": "test_assisted_sampling_matches_plain_sampling",
        "drafters/test_any_draft_sampling.py": "test_sampling_with_another_vocabulary_matches_plain_sampling",
        "drafters/test_prompt_lookup.py": "test_sampling_with_prompt_lookup_matches_plain_sampling",
    }
    for file, name in long_tests.items():
        tree = ast.parse((ROOT / "tests" / file).read_text())
        (function,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
        assert "pytest.mark.slow" in [ast.unparse(d) for d in function.decorator_list], f"{file}::{name}"

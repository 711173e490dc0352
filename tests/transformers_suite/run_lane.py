"""Run transformers' GenerationTesterMixin tests per model, without the package (plain) and/or routed
through `assisted_backends.enable` (routed), one model at a time, and write the results table.

    python tests/transformers_suite/run_lane.py --modes plain,routed --models llama,gpt2 --out /tmp/hflane
    python tests/transformers_suite/run_lane.py --modes routed        # what CI runs: routed only

Exit status: 1 when a routed run has a failure or error that is not a documented refusal, else 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fetch_tests  # noqa: E402
import summarize  # noqa: E402

MODELS = ("llama", "mistral", "qwen2", "gemma2", "gpt2", "gpt_neox", "phi3", "starcoder2", "falcon", "opt")


def run_one(tree: Path, model: str, mode: str, out: Path, extra: list[str]) -> dict:
    test_file = tree / "tests" / "models" / model / f"test_modeling_{model}.py"
    xml = out / f"{model}-{mode}.xml"
    command = [
        sys.executable, "-m", "pytest", str(test_file.relative_to(tree)), "-p", "hf_lane_plugin",
        f"--hf-lane-mode={mode}", "-q", "-p", "no:cacheprovider", "-W", "ignore", "-o", "log_cli=false",
        f"--junitxml={xml}", "-o", "junit_family=xunit1", "-rfE", *extra,
    ]  # fmt: skip
    environment = dict(os.environ)
    repo = HERE.parent.parent
    environment["PYTHONPATH"] = os.pathsep.join([str(repo), str(HERE), environment.get("PYTHONPATH", "")])
    environment.setdefault("OMP_NUM_THREADS", "1")
    started = time.monotonic()
    with open(out / f"{model}-{mode}.log", "w", encoding="utf-8") as log:
        status = subprocess.run(command, cwd=tree, env=environment, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - started
    print(f"{model:12s} {mode:7s} exit {status} in {seconds:6.1f}s -> {xml}", flush=True)
    return dict(model=model, mode=mode, xml=xml, status=status, seconds=seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default="routed")
    parser.add_argument("--out", default=os.environ.get("HF_LANE_OUT", "/tmp/hf-generation-lane"))
    parser.add_argument("--results", default=None, help="write the markdown table here too")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    try:
        tree = fetch_tests.fetch()
    except SystemExit as unavailable:  # CI machines reach package registries only, which lack the test tree
        if os.environ.get("HF_LANE_REQUIRED") == "1":
            raise
        print(
            f"SKIPPED: transformers' test tree is not reachable here ({unavailable}); HF_LANE_REQUIRED=1 fails instead"
        )
        return 0
    fetch_tests.link_installed(tree)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            runs.append(run_one(tree, model, mode, out, args.pytest_args))
    table = summarize.render(runs, tree)
    print(table)
    (out / "RESULTS.md").write_text(table, encoding="utf-8")
    if args.results:
        Path(args.results).write_text(table, encoding="utf-8")
    routed_bad = [run for run in runs if run["mode"] == "routed" and summarize.counts(run["xml"])["bad"]]
    return 1 if routed_bad else 0


if __name__ == "__main__":
    sys.exit(main())

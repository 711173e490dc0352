"""The default draft, chosen when `-m` comes without a drafter: one from the target's family, never larger than its
target, decided from the target's local files (a `.gguf`'s tensor table, a directory's config.json) before torch
loads and in well under a second, and used only when it is already on this machine (never downloaded implicitly,
no network access). Where none suits (a family without one, a target not larger than it, a draft not here) the run
drafts by suffix decoding instead (no draft model), said in one line of its report with the reason and the
options (the families that have a default, `hf download`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from cli_fixtures import claiming_7b, run_main
from transformers import AutoModelForCausalLM

from assisted_backends.cli.main import main
from assisted_backends.demo.pair import shipped_pair
from assisted_backends.startup.default_draft import default_drafting
from assisted_backends.startup.model_files import estimate_parameters, locate

DRAFT = "PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T"
LARGER = f"is not larger than its family's usual draft {DRAFT} (1.1B)"
SUFFIX = "note: drafting by suffix decoding (no draft model: "


def _suffix_notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "suffix decoding" in line]


def test_unknown_architecture_without_a_draft_drafts_by_suffix_and_lists_the_options(saved_pair, capsys):
    code, _, stderr = run_main(capsys, "-m", str(saved_pair / "gpt2"), "--max-new-tokens", "4")
    assert code == 0, stderr
    (note,) = _suffix_notes(stderr)
    assert note.startswith(SUFFIX) and "no default draft for a 'gpt2' target" in note
    assert "opt -> facebook/opt-125m" in note and "--assistant-model DIR" in note


def test_a_target_smaller_than_its_familys_draft_drafts_by_suffix_decided_in_under_a_second(
    tiny_llama, target_gguf, capsys
):
    parameters = sum(p.numel() for p in tiny_llama[1].parameters())
    began = time.perf_counter()
    files = locate(str(target_gguf), "-m/--model")
    chosen = default_drafting(files.config["model_type"], files.parameters)
    elapsed = time.perf_counter() - began
    assert files.parameters == parameters  # counted from the tensor table
    assert chosen.draft is None and LARGER in chosen.reason
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert main(["-m", str(target_gguf), "--max-new-tokens", "4"]) == 0  # the first command a newcomer types runs
    captured = capsys.readouterr()
    (note,) = _suffix_notes(captured.err)  # said in one line of the run's report
    assert note.startswith(SUFFIX) and LARGER in note and "--prompt-lookup N" in note, captured.err
    assert "error" not in captured.err


def test_the_decision_needs_no_torch(target_gguf):
    code = ("import sys; from assisted_backends.cli.args import build_parser, validate; "
            "from assisted_backends.startup.flags import device_names; from assisted_backends.cli.preflight import "
            f"preflight; args = build_parser(device_names()).parse_args(['-m', {str(target_gguf)!r}]); "
            "validate(args); preflight(args); print(args.default_drafting.draft, 'torch' in sys.modules); "
            "print(args.default_drafting.note())")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.splitlines()[0].split() == ["None", "False"], run.stderr[-2000:]
    assert LARGER in run.stdout


def test_parameters_estimated_from_config_json_match_the_loaded_model():
    pair = shipped_pair()
    for directory in (pair.target_dir, pair.draft_dir):
        counted = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(directory).parameters())
        estimated = estimate_parameters(json.loads((directory / "config.json").read_text()))
        assert abs(estimated - counted) <= 0.01 * counted, (directory, estimated, counted)


def test_missing_default_draft_gives_suffix_decoding_at_once_without_network(saved_pair, tmp_path):
    """No HF_HUB_OFFLINE: the Hub endpoint is a local socket that counts connections; none may arrive. (The target
    only claims 7B in its config.json, so the decision is checked up to preflight, which is where it is made.)"""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        target = str(claiming_7b(saved_pair / "target"))
        code = ("from assisted_backends.cli.args import build_parser, validate; "
                "from assisted_backends.startup.flags import device_names; from assisted_backends.cli.preflight import "
                f"preflight; args = build_parser(device_names()).parse_args(['-m', {target!r}]); validate(args); "
                "preflight(args); print(args.default_drafting.draft); print(args.default_drafting.note())")  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "", "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")}
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        try:
            server.accept()
            connected = True
        except BlockingIOError:
            connected = False
    finally:
        server.close()
    draft, note = run.stdout.splitlines()[:2]
    assert draft == "None", run.stderr[-2000:]
    for needle in (SUFFIX, f"default draft {DRAFT} is not on this machine", "--prompt-lookup",
                   "--assistant-early-exit", "hf download"):  # fmt: skip
        assert needle in note, note
    assert not connected, "the default draft must not be downloaded implicitly"


def test_suffix_cache_flag_runs_and_refuses_a_second_drafter(target_gguf, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two three\none two three\n")
    code, out, err = run_main(capsys, "-m", str(target_gguf), "--suffix-cache", "--prompt-file", str(prompts),
                              "--batch-size", "2", "--max-new-tokens", "6")  # fmt: skip
    assert code == 0 and out.count("--- prompt") == 2, err
    assert not _suffix_notes(err)  # asked for: no default to explain
    code, _, err = run_main(capsys, "-m", str(target_gguf), "--suffix-cache", "--prompt-lookup", "3")
    assert code == 2 and "choose one way of drafting, got --prompt-lookup and --suffix-cache" in err, err

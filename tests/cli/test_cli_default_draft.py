"""The default draft, chosen when `-m` comes without a drafter: one from the target's family (a family without
one gets the list of those that have one), never larger than its target, decided from the target's local files
(a `.gguf`'s tensor table, a directory's config.json) before torch loads and in well under a second, with prompt
lookup as the advice; and used only when it is already on this machine (never downloaded implicitly, no
network access), otherwise a one-line error naming the offline options."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from cli_fixtures import assert_one_line_error, claiming_7b, run_cli, run_main
from transformers import AutoModelForCausalLM

from assisted_backends.cli.main import main
from assisted_backends.cli.model_files import estimate_parameters, locate
from assisted_backends.demo.pair import shipped_pair

DRAFT = "PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T"
LARGER = f"is not larger than its family's usual draft {DRAFT} (1.1B)"


def test_unknown_architecture_without_a_draft_lists_the_options(saved_pair, capsys):
    code, _, stderr = run_main(capsys, "-m", str(saved_pair / "gpt2"))
    assert code == 2 and "no default draft for a 'gpt2' target" in stderr and "opt -> facebook/opt-125m" in stderr


def test_a_target_smaller_than_its_familys_draft_gets_prompt_lookup_advice_in_under_a_second(
    tiny_llama, target_gguf, capsys
):
    parameters = sum(p.numel() for p in tiny_llama[1].parameters())
    assert locate(str(target_gguf), "-m/--model").parameters == parameters  # counted from the tensor table
    began = time.perf_counter()
    assert main(["-m", str(target_gguf), "--max-new-tokens", "4"]) == 2
    elapsed = time.perf_counter() - began
    err = capsys.readouterr().err.strip()
    assert LARGER in err and "--prompt-lookup 10" in err and len(err.splitlines()) == 1, err
    assert elapsed < 1.0, f"{elapsed:.2f} s"


def test_the_decision_needs_no_torch(target_gguf):
    code = ("import sys; from assisted_backends.cli.main import main; "
            f"code = main(['-m', {str(target_gguf)!r}]); print(code, 'torch' in sys.modules)")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["2", "False"], run.stderr[-2000:]
    assert LARGER in run.stderr


def test_parameters_estimated_from_config_json_match_the_loaded_model():
    pair = shipped_pair()
    for directory in (pair.target_dir, pair.draft_dir):
        counted = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(directory).parameters())
        estimated = estimate_parameters(json.loads((directory / "config.json").read_text()))
        assert abs(estimated - counted) <= 0.01 * counted, (directory, estimated, counted)


def test_missing_default_draft_is_reported_at_once_without_network(saved_pair, tmp_path):
    """No HF_HUB_OFFLINE: the Hub endpoint is a local socket that counts connections; none may arrive."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        run = run_cli("-m", str(claiming_7b(saved_pair / "target")), HF_HUB_OFFLINE="", HF_ENDPOINT=endpoint,
                      HF_HOME=str(tmp_path / "hf"))  # fmt: skip
        try:
            server.accept()
            connected = True
        except BlockingIOError:
            connected = False
    finally:
        server.close()
    assert_one_line_error(run, f"default draft {DRAFT} is not on this machine", "--prompt-lookup",
                          "--assistant-early-exit", "hf download")  # fmt: skip
    assert not connected, "the default draft must not be downloaded implicitly"

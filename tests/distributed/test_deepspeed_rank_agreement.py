"""Multi-card launches take the same decisions on every rank and always end (docs/design.md rule 9).

2 CPU ranks (gloo, DeepSpeed AutoTP) under `torch.distributed.run`, a busy process beside them so
that the ranks' wall times (which drive the adaptive schedule) differ:
- 20 consecutive launches of the CLI, greedy with the adaptive schedule (tokens equal to the
  single-process CLI run) and seeded sampling with the adaptive schedule (rank 0's tokens equal
  rank 1's); before the agreement a few in five such launches died in `gloo::EnforceNotMet`;
- the Python API under the launcher (tests/torchrun_generate.py): greedy, static shapes, prompt
  lookup, seeded and unseeded sampling, and queues (rows joining as others end: which row joins when is a
  function of tokens, the same on every rank); ranks given different prompts or queues stop with an error;
- a rank stuck in a collective: its peer ends with an error naming its rank and step within the
  bound (`ASSISTED_BACKENDS_COLLECTIVE_TIMEOUT_S`), not a silent wait.
Runs in the DeepSpeed lane (`.ci/lanes/deepspeed.sh`); skipped when deepspeed is not installed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_deepspeed_tp import _two_rank_launcher

HERE = Path(__file__).resolve().parent
LAUNCHES = int(os.environ.get("ASSISTED_BACKENDS_STRESS_LAUNCHES", "20"))
CLI_TOKENS = 64  # enough plain time left for the draft's try to fit the trial budget (at 16 it is never tried)
BUSY_LOOP = (  # spin 50 ms, rest 20 ms, forever
    "import time\n"
    "while True:\n"
    "    end = time.perf_counter() + 0.05\n"
    "    while time.perf_counter() < end:\n"
    "        pass\n"
    "    time.sleep(0.02)\n"
)

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None and not os.environ.get("ASSISTED_BACKENDS_DEEPSPEED_LANE"),
        reason="needs deepspeed: pip install assisted_backends[deepspeed] (the CI lane .ci/lanes/deepspeed.sh does)",
    ),
]


def _env(**extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]),
        **extra,  # this checkout's package, not an installed one
    )


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory) -> Path:
    """A saved Llama target (4 layers, the last 3 writing almost nothing to the residual stream) and a
    1-layer draft cut from it plus noise: acceptance around one half at a third of the target's
    cost, so the adaptive schedule's choices (plain, probe, how deep) hinge on measured wall times."""
    from tiny_models import tiny_model

    from assisted_backends.demo.corpus import read_corpus
    from assisted_backends.demo.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("pair")
    tokenizer = train_tokenizer(read_corpus(60_000)[0], 320)
    target = tiny_model("llama", seed=0, hidden=128, layers=4, vocab=len(tokenizer), init=0.1)
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = 1
    draft = type(target)(config).eval()
    draft.load_state_dict(target.state_dict(), strict=False)  # layer 0, embeddings, norm, head
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(0.05 * parameter.std().nan_to_num(0.0) * torch.randn_like(parameter))
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


@pytest.fixture
def busy_cpu():
    """A process beside the ranks that spins most of the time: their timings diverge."""
    spinner = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    yield spinner
    spinner.kill()
    spinner.wait()


def _cli_flags(pair: Path, mode: str) -> list[str]:
    flags = ["-m", str(pair / "target"), "--assistant-model", str(pair / "draft"), "--device", "cpu"]
    flags += ["--dtype", "fp32", "--threads", "1", "--prompt", "import os", "--max-new-tokens", str(CLI_TOKENS)]
    flags += ["--schedule", "adaptive", "--no-stream"]
    return flags + (["--do-sample", "--seed", "7"] if mode == "sample" else [])


def _tail(completed: subprocess.CompletedProcess) -> str:
    return (completed.stdout or "")[-3000:] + (completed.stderr or "")[-5000:]


def test_twenty_cli_launches_agree_on_every_rank_under_load(pair_dir, busy_cpu, tmp_path):
    from assisted_backends.cli.main import main

    assert main([*_cli_flags(pair_dir, "greedy"), "--json", str(tmp_path / "single.json")]) == 0
    single = json.loads((tmp_path / "single.json").read_text())["generated_token_ids"]
    assert len(single) == CLI_TOKENS

    varied = set()
    for launch in range(LAUNCHES):
        mode = "greedy" if launch % 2 == 0 else "sample"
        out = tmp_path / f"launch{launch}.{{rank}}.json"
        command = [
            *_two_rank_launcher(),
            "-m",
            "assisted_backends.cli",
            *_cli_flags(pair_dir, mode),
            "--json",
            str(out),
        ]
        completed = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
        assert completed.returncode == 0, f"launch {launch + 1} of {LAUNCHES} ({mode}) failed:\n{_tail(completed)}"
        ranks = [json.loads(Path(str(out).format(rank=rank)).read_text()) for rank in range(2)]
        tokens = [report["generated_token_ids"] for report in ranks]
        assert tokens[0] == tokens[1], f"launch {launch + 1} ({mode}): rank 0 and rank 1 differ"
        if mode == "greedy":
            assert tokens[0] == single, f"launch {launch + 1}: greedy differs from the single-process run"
        assert len(tokens[0]) == CLI_TOKENS
        stats = ranks[0]["stats"]
        varied.add((stats["speculative_rounds"], stats["plain_rounds"]))
    # the schedule really chose: runs mixed speculative and plain rounds, and not always the same way
    assert any(speculative and plain for speculative, plain in varied), varied


def _launch_api(pair: Path, out: Path, *flags: str, timeout_env: str | None = None, timeout: float = 600):
    out.mkdir()
    extra = {"ASSISTED_BACKENDS_COLLECTIVE_TIMEOUT_S": timeout_env} if timeout_env else {}
    command = [
        *_two_rank_launcher(),
        str(HERE.parent / "torchrun_generate.py"),
        "--model-dir",
        str(pair),
        "--out",
        str(out),
        *flags,
    ]
    return subprocess.run(command, env=_env(**extra), capture_output=True, text=True, timeout=timeout)


def test_the_api_under_torchrun_agrees_on_every_rank(pair_dir, busy_cpu, tmp_path):
    from torchrun_generate import CASES, PROMPT, run_case
    from transformers import AutoModelForCausalLM

    cases = [*CASES, "different_prompts", "different_queues"]
    completed = _launch_api(pair_dir, tmp_path / "out", "--cases", *cases)
    assert completed.returncode == 0, _tail(completed)
    reports = [json.loads((tmp_path / "out" / f"rank{rank}.json").read_text()) for rank in range(2)]

    target = AutoModelForCausalLM.from_pretrained(pair_dir / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(pair_dir / "draft").eval()
    for name in CASES:
        assert reports[0]["tokens"][name] == reports[1]["tokens"][name], name
        if name.startswith("greedy"):
            assert reports[0]["tokens"][name] == run_case(target, draft, CASES[name], PROMPT), name
    # seeded sampling with a constant γ draws the same numbers as one process does: the same tokens
    seeded = "sample_seeded_constant"
    assert reports[0]["tokens"][seeded] == run_case(target, draft, CASES[seeded], PROMPT)
    for report in reports:
        for name in ("different_prompts", "different_queues"):  # a queue: every prompt is checked, not the first batch
            assert name not in report["tokens"]
            message = report["errors"][name]
            assert f"rank {report['rank']} of 2" in message and "different arguments" in message, message


# rank 1 sleeps at its 3rd target forward (round 2: prefill, then two plain rounds) or at its 3rd
# per-round agreement (round 3); rank 0 waits in the target's all-reduce or in the agreement
@pytest.mark.parametrize("stall_in, where", [("target_forward", "round 2"), ("agreement", "round 3")])
def test_a_stuck_rank_ends_the_launch_with_an_error_naming_rank_and_step(pair_dir, tmp_path, stall_in, where):
    bound, stall = 20, 400
    started = time.monotonic()
    completed = _launch_api(
        pair_dir,
        tmp_path / "out",
        "--cases",
        "greedy_adaptive",
        "--stall-rank",
        "1",
        "--stall-in",
        stall_in,
        "--stall-at",
        "3",
        "--stall-s",
        str(stall),
        timeout_env=str(bound),
        timeout=stall - 20,
    )
    elapsed = time.monotonic() - started
    assert completed.returncode != 0, _tail(completed)
    output = completed.stdout + completed.stderr
    assert f"rank 0 of 2, at {where}" in output, _tail(completed)
    assert f"did not complete within {bound} s" in output, _tail(completed)
    assert elapsed < stall - 20  # ended by the bound, not by the sleeping rank waking up

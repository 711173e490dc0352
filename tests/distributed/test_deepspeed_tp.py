"""DeepSpeed AutoTP on 2 CPU ranks (gloo): sharded target, replicated draft, same tokens as one process.

The test saves a tiny Llama pair, runs assisted greedy generation in this process, then launches
this same file as a 2-rank job (`python -m torch.distributed.run --nproc_per_node 2`); each rank
loads the saved models with `from_pretrained`, shards the target through `assisted_backends.distributed.launch`
and writes its tokens and weight shapes to JSON. Skipped when deepspeed is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PROMPT = [5, 17, 99, 3, 64, 21, 8, 120, 42]
MAX_NEW_TOKENS = 24
GAMMA = 3
MODES = {"dynamic": False, "static": True}  # name -> static_shapes


def run_generation(target, draft, static_shapes: bool) -> list[int]:
    from assisted_backends import generate

    result = generate(
        target,
        torch.tensor([PROMPT]),
        assistant_model=draft,
        max_new_tokens=MAX_NEW_TOKENS,
        num_assistant_tokens=GAMMA,
        static_shapes=static_shapes,
        bucket_size=16,
        device="cpu",
    )
    return result.sequences[0].tolist()


def rank_main(model_dir: Path, out_dir: Path) -> None:
    """Entry point of each launched rank."""
    from transformers import AutoModelForCausalLM

    from assisted_backends.distributed import launch as distributed

    context = distributed.launch_context()
    assert context is not None, "launched without WORLD_SIZE > 1"
    torch.set_num_threads(1)
    distributed.init_distributed(context, "cpu")
    target = AutoModelForCausalLM.from_pretrained(model_dir / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(model_dir / "draft").eval()
    target = distributed.shard_target(target, context)
    report = {
        "rank": context.rank,
        "world_size": torch.distributed.get_world_size(),
        "backend": torch.distributed.get_backend(),
        "is_main_process": distributed.is_main_process(),
        "tokens": {mode: run_generation(target, draft, static) for mode, static in MODES.items()},
        "target_shapes": {name: list(p.shape) for name, p in target.named_parameters()},
        "draft_shapes": {name: list(p.shape) for name, p in draft.named_parameters()},
    }
    (out_dir / f"rank{context.rank}.json").write_text(json.dumps(report))
    distributed.shutdown()  # a barrier first: gloo can abort a rank at exit otherwise (both ranks did once in CI)


# ---------------------------------------------------------------- the test (single process side)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_rank_launcher() -> list[str]:
    """torch.distributed.run with two processes on this machine (a fresh port each time)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
    ]


def _save_pair(model_dir: Path):
    from tiny_models import noisy_copy, tiny_model

    target = tiny_model("llama", seed=0, hidden=128, layers=2)
    draft = noisy_copy(target, seed=3, scale=0.05)
    target.save_pretrained(model_dir / "target")
    draft.save_pretrained(model_dir / "draft")
    return target, draft


@pytest.mark.distributed
@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None and not os.environ.get("ASSISTED_BACKENDS_DEEPSPEED_LANE"),
    reason="needs deepspeed: pip install assisted_backends[deepspeed] (the CI lane .ci/lanes/deepspeed.sh does)",
)
def test_two_cpu_ranks_match_one_process_and_hold_half_the_sharded_weights(tmp_path):
    from tiny_models import reference_greedy

    target, draft = _save_pair(tmp_path / "models")
    expected = reference_greedy(target, torch.tensor([PROMPT]), MAX_NEW_TOKENS)[0].tolist()
    single = {mode: run_generation(target, draft, static) for mode, static in MODES.items()}
    assert single == {"dynamic": expected, "static": expected}

    out_dir = tmp_path / "ranks"
    out_dir.mkdir()
    python_path = os.pathsep.join(str(p) for p in Path(__file__).resolve().parents[:2])
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=python_path)
    command = [
        *_two_rank_launcher(),
        __file__,
        "--model-dir",
        str(tmp_path / "models"),
        "--out",
        str(out_dir),
    ]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    reports = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(2)]

    full = {name: list(p.shape) for name, p in target.named_parameters()}
    for report in reports:
        assert report["world_size"] == 2 and report["backend"] == "gloo"
        assert report["is_main_process"] == (report["rank"] == 0)
        assert report["tokens"] == single, f"rank {report['rank']} differs from the single-process run"
        assert report["draft_shapes"] == {name: list(p.shape) for name, p in draft.named_parameters()}

        sharded = {name for name, shape in report["target_shapes"].items() if shape != full[name]}
        # AutoTP splits every attention and MLP projection of every layer (o_proj/down_proj by input
        # features, the others by output features); nothing else changes shape except possibly lm_head.
        projections = {n for n in full if n.endswith("proj.weight")}
        assert projections <= sharded, sorted(projections - sharded)
        for name in sharded:
            assert sum(report["target_shapes"][name]) != 0
            rank_numel = torch.Size(report["target_shapes"][name]).numel()
            assert 2 * rank_numel == torch.Size(full[name]).numel(), (name, report["target_shapes"][name], full[name])


@pytest.mark.distributed
@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None and not os.environ.get("ASSISTED_BACKENDS_DEEPSPEED_LANE"),
    reason="needs deepspeed: pip install assisted_backends[deepspeed] (the CI lane .ci/lanes/deepspeed.sh does)",
)
@pytest.mark.parametrize("batch_size", [1, 2])
def test_the_command_under_torchrun_matches_the_single_process_command(tmp_path, batch_size):
    """`torchrun --nproc_per_node 2 examples/run_assisted_generation.py ...`: same tokens, rank 0 alone prints;
    with `--batch-size 2`, two different prompts from a file in one batch."""
    from tiny_models import noisy_copy, tiny_model

    from assisted_backends.demo.corpus import read_corpus
    from assisted_backends.demo.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(read_corpus(60_000)[0], 320)
    target = tiny_model("llama", seed=0, hidden=128, layers=2, vocab=len(tokenizer), init=0.1)
    for name, model in (("target", target), ("draft", noisy_copy(target, seed=3, scale=0.05))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    script = str(Path(__file__).resolve().parents[2] / "examples" / "run_assisted_generation.py")
    flags = [
        "-m",
        str(tmp_path / "target"),
        "--assistant-model",
        str(tmp_path / "draft"),
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--max-new-tokens",
        "16",
        "--num-assistant-tokens",
        "3",
    ]
    if batch_size == 1:
        flags += ["--prompt", "def main():"]
    else:
        (tmp_path / "prompts.txt").write_text("def main():\nclass Stack:\n    def push(self, item):\n")
        flags += ["--prompt-file", str(tmp_path / "prompts.txt"), "--batch-size", str(batch_size)]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    single = subprocess.run(
        [sys.executable, script, *flags, "--json", str(tmp_path / "single.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    launch = [
        *_two_rank_launcher(),
        script,
        *flags,
        "--json",
        str(tmp_path / "multi.json"),
    ]
    multi = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=600)
    assert multi.returncode == 0, multi.stdout[-3000:] + multi.stderr[-3000:]
    one = json.loads((tmp_path / "single.json").read_text())
    two = json.loads((tmp_path / "multi.json").read_text())
    assert two["generated_token_ids"] == one["generated_token_ids"]
    rows = one["generated_token_ids"] if batch_size > 1 else [one["generated_token_ids"]]
    assert [len(row) for row in rows] == [16] * len(rows) and len(rows) == (3 if batch_size > 1 else 1)
    assert multi.stdout.count("def main():") == 1, "only rank 0 prints"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one rank of the DeepSpeed AutoTP test (launched by the test)")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args()
    rank_main(arguments.model_dir, arguments.out)


def test_shutdown_leaves_the_process_group_and_is_a_no_op_without_one(tmp_path):
    """The CLI's last step under a launcher: barrier, then destroy (no gloo thread left at exit)."""
    from assisted_backends.distributed import launch as distributed

    distributed.shutdown()  # no group: nothing to do
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert torch.distributed.is_initialized()
    distributed.shutdown()
    assert not torch.distributed.is_initialized()

"""One rank of a `torchrun --nproc_per_node 2` launch that calls `assisted_backends.generate` directly
(and `generate_queue`: the cases with `queue=True` run QUEUE through two slots, rows joining as others end).

Launched by tests/distributed/test_deepspeed_rank_agreement.py (not collected by pytest). Each rank joins the
group, shards the target with DeepSpeed AutoTP, runs every case of `CASES` and writes its tokens
(or the error each call raised) to `<out>/rank<r>.json`. `--stall-rank R --stall-at N` makes rank R
sleep `--stall-s` seconds at the Nth call of `--stall-in` (the target's forward, or the per-round
agreement), so that its peer waits in a collective that never completes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

PROMPT = [5, 17, 99, 3, 64, 21, 8, 120, 42, 7, 99, 3]
MAX_NEW_TOKENS = 12
CASES = {  # name -> generate() arguments (every rank passes the same ones)
    "greedy_adaptive": dict(schedule="adaptive"),
    "greedy_static_constant": dict(static_shapes=True, bucket_size=16, num_assistant_tokens=3),
    "greedy_prompt_lookup": dict(prompt_lookup_num_tokens=3, schedule="adaptive", no_draft=True),
    "sample_seeded_adaptive": dict(do_sample=True, seed=11, schedule="adaptive"),
    "sample_unseeded_adaptive": dict(do_sample=True, schedule="adaptive"),
    "sample_unseeded_constant": dict(do_sample=True, num_assistant_tokens=2),
    "sample_seeded_constant": dict(do_sample=True, seed=11, num_assistant_tokens=2),
    "greedy_queue_adaptive": dict(queue=True, schedule="adaptive"),
    "greedy_queue_static_constant": dict(queue=True, static_shapes=True, bucket_size=16, num_assistant_tokens=3),
    "greedy_queue_prompt_lookup": dict(queue=True, prompt_lookup_num_tokens=3, schedule="adaptive", no_draft=True),
    "sample_queue_seeded_adaptive": dict(queue=True, do_sample=True, seed=11, schedule="adaptive"),
}
QUEUE = [PROMPT, PROMPT[3:], PROMPT[:5], [64, 21, 8], PROMPT[1:] + PROMPT[:4]]  # mixed lengths, through 2 slots


def run_case(target, draft, case: dict, prompt: list[int]) -> list[int] | list[list[int]]:
    """The new tokens of `prompt` (a queue case: of every prompt of QUEUE, `prompt` shortening the first one)."""
    from assisted_backends import generate, generate_queue

    arguments = dict(case)
    assistant = None if arguments.pop("no_draft", False) else draft
    if arguments.pop("queue", False):
        prompts = [prompt, *QUEUE[1:]]
        result = generate_queue(
            target, prompts, slots=2, assistant_model=assistant, max_new_tokens=MAX_NEW_TOKENS, device="cpu",
            **arguments,
        )  # fmt: skip
        return [tokens.tolist() for tokens in result.tokens]
    result = generate(
        target,
        torch.tensor([prompt]),
        assistant_model=assistant,
        max_new_tokens=MAX_NEW_TOKENS,
        device="cpu",
        **arguments,
    )
    return result.sequences[0, len(prompt) :].tolist()


def _stall(obj, name: str, at: int, seconds: float) -> None:
    """Make `obj.name` sleep `seconds` before its `at`-th call."""
    original, calls = getattr(obj, name), [0]

    def stalled(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            time.sleep(seconds)
        return original(*args, **kwargs)

    setattr(obj, name, stalled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--stall-rank", type=int, default=None)
    parser.add_argument("--stall-in", choices=("target_forward", "agreement"), default="target_forward")
    parser.add_argument("--stall-at", type=int, default=3)
    parser.add_argument("--stall-s", type=float, default=0.0)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from assisted_backends.distributed import agreement as rank_agreement
    from assisted_backends.distributed import launch as distributed

    context = distributed.launch_context()
    assert context is not None, "launched without WORLD_SIZE > 1"
    torch.set_num_threads(1)
    distributed.init_distributed(context, "cpu")
    target = AutoModelForCausalLM.from_pretrained(args.model_dir / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(args.model_dir / "draft").eval()
    target = distributed.shard_target(target, context)
    if args.stall_rank == context.rank:
        if args.stall_in == "target_forward":
            _stall(target, "forward", args.stall_at, args.stall_s)
        else:
            _stall(rank_agreement.AgreedSchedule, "draft_length", args.stall_at, args.stall_s)

    report: dict = {"rank": context.rank, "tokens": {}, "errors": {}}
    for name in args.cases:
        prompt = PROMPT if not name.startswith("different_") else PROMPT[: len(PROMPT) - context.rank]
        case = CASES.get(name, {"queue": True} if name == "different_queues" else {})
        try:
            report["tokens"][name] = run_case(target, draft, case, prompt)
        except rank_agreement.RankFailure as error:
            report["errors"][name] = str(error)
            if args.stall_rank is not None:  # a stuck peer: the group is unusable, stop like the CLI does
                print(f"error: {error}", flush=True)
                (args.out / f"rank{context.rank}.json").write_text(json.dumps(report))
                distributed.shutdown(wait_for_peers=False)
                raise SystemExit(2) from None
    (args.out / f"rank{context.rank}.json").write_text(json.dumps(report))
    distributed.shutdown()


if __name__ == "__main__":
    main()

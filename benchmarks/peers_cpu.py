"""llama.cpp's own C++ tools on the package's benchmark files: the CPU peer's figures in one command.

    python -m benchmarks.peers_cpu            # SmolLM2 Q4_1, Gemma 3 Q4_K_M, random 0.5B/1.5B Q4_0, Q4_K; 1, 2 threads
    python -m benchmarks.peers_cpu --quick    # SmolLM2 only, 1 thread, the edit task, 64 tokens (under 2 minutes)
    python -m benchmarks.peers_cpu --files smollm2-135m-instruct random-7B-Q4_K --threads 2

For each `.gguf` file (the two real models through `benchmarks.harness.ensure_real_gguf`; `random-<size>-<quant>`
files written by `benchmarks.gguf_scaling.random_file`, any of 0.5B / 1.5B / 3B / 7B x Q4_0 / Q8_0 / Q4_K; or a
path) and thread count, with llama.cpp's tools built from llama-cpp-python's vendored source
(`benchmarks.harness.llama_cpp_tools`): llama-bench's plain decoding tok/s (tg64 from an empty context) and
prompt tok/s at 128 and 512 tokens (means of `--bench-repetitions` runs with their standard deviation); then on
each task of `benchmarks.harness.tasks` (the chat template of the file applied, as the package's benchmarks do;
`edit` and `summarize` are grounded in the prompt, `open` is not) greedy decoding of `--new-tokens` tokens with
EOS ignored, plain (llama-completion) and with prompt-lookup decoding (llama-lookup, n-gram drafts of up to
`--draft` tokens: 3, llama.cpp's default, and 10, the package's benchmarks'; 0 is plain decoding in the same
loop), alternating `--repeats` times, medians with [min, max], lookup's acceptance and tokens per verify pass,
and whether each output equals llama-completion's plain output (llama.cpp is not batch-invariant: llama-lookup
evaluates the prompt's last token alone, llama-completion with the rest, and drafts change the batch shapes).
Random-weight files run `--random-tasks` only (their output is noise whatever the prompt; only its length and
repetition matter).
`--speculative` adds llama-speculative-simple with its n-gram drafter (`--spec-type`), and with a draft model
where one shares the file's vocabulary (random 0.5B drafting for random 1.5B). The 1-minute load
average before and after each file is recorded: the machine is shared, read the figures with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.llama_cpp_tools import (
    cache_key,
    cpu_model_and_flags,
    llama_cpp_tools,
    run_bench,
    run_completion,
    run_lookup,
    run_speculative,
)
from benchmarks.harness.tasks import TASKS

REAL = ("smollm2-135m-instruct", "gemma-3-270m")
DEFAULT_FILES = (*REAL, "random-0.5B-Q4_0", "random-0.5B-Q4_K", "random-1.5B-Q4_0", "random-1.5B-Q4_K")
GROUNDED = ("edit", "summarize")


def resolve(name: str) -> Path:
    """A real model's name, `random-<size>-<quant>`, or a path -> the .gguf file (fetched or written on first use)."""
    if name in REAL:
        from benchmarks.harness import ensure_real_gguf

        return ensure_real_gguf(name)
    if name.startswith("random-"):
        from benchmarks.gguf_scaling import random_file

        size, quant = name[len("random-") :].rsplit("-", 1)
        return random_file(size, quant)
    path = Path(name)
    if not path.is_file():
        raise SystemExit(f"{name}: neither {REAL}, random-<size>-<quant>, nor a file")
    return path


def rendered_prompt(path: Path, task: str) -> str:
    """The task's text inside the file's own chat template (from its GGUF metadata, rendered with jinja2 like
    transformers' apply_chat_template; the BOS token left to llama.cpp's tokenizer, which adds it where the
    vocabulary asks), or the plain text where the file has no template."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("tokenizer.chat_template")
    text = TASKS[task]
    if field is None:
        return text
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = bytes(field.parts[field.data[0]]).decode()

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(template).render(
        messages=[{"role": "user", "content": text}], add_generation_prompt=True, bos_token="", eos_token=""
    )


def tensor_types(path: Path) -> dict[str, int]:
    """{GGML type: how many tensors} of the file (random 0.5B "Q4_K" is mostly Q5_0: its 896-wide rows do not
    divide into Q4_K's 256-weight blocks, as with llama-quantize)."""
    import collections

    import gguf

    return dict(collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors))


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "spread": [round(min(values), 2), round(max(values), 2)]}


def _draft_for(name: str) -> Path | None:
    """A draft model sharing `name`'s vocabulary, for llama-speculative-simple (random 1.5B / 3B: random 0.5B of the
    same quantization; the 0.5B and 1.5B files share the 151,936-token vocabulary, 3B's is 128,256 wide)."""
    if name.startswith("random-1.5B-"):
        return resolve(name.replace("1.5B", "0.5B"))
    return None


def measure_tasks(name: str, path: Path, args, tools: dict, workdir: Path) -> dict:
    out: dict = {}
    for task in args.random_tasks if name.startswith("random-") else args.tasks:
        prompt_file = workdir / f"{path.stem}-{task}.txt"
        prompt_file.write_text(rendered_prompt(path, task))
        for threads in args.task_threads or args.threads:
            runs: dict[str, list[dict]] = {"plain": [], **{f"lookup_d{d}": [] for d in args.draft}}
            extra = {}
            if args.speculative:
                extra[f"spec_{args.spec_type}"] = dict(spec_type=args.spec_type)
                if (draft := _draft_for(name)) is not None:
                    extra["spec_draft_model"] = dict(draft_model=draft)
                runs.update({key: [] for key in extra})
            for _ in range(args.repeats):  # alternate the methods, so load drifts hit them alike
                runs["plain"].append(run_completion(path, prompt_file, args.new_tokens, threads, tools=tools))
                for draft in args.draft:
                    lookup = run_lookup(path, prompt_file, args.new_tokens, threads, draft, tools=tools)
                    runs[f"lookup_d{draft}"].append(lookup)
                for key, options in extra.items():
                    runs[key].append(run_speculative(path, prompt_file, args.new_tokens, threads, max(args.draft),
                                                     tools=tools, **options))  # fmt: skip
            case = {"grounded": task in GROUNDED, "prompt_tokens": runs["plain"][0].get("prompt_tokens")}
            for method, results in runs.items():
                case[method] = {
                    "tok_s": _summary([r["decode_tok_s"] for r in results]),
                    "new_tokens": results[0]["new_tokens"],
                    "prompt_tok_s": _summary([r["prompt_tok_s"] for r in results if r.get("prompt_tok_s")] or [0.0]),
                    "command": " ".join(results[0]["command"]),
                }
                if method != "plain":
                    first = results[0]
                    case[method].update(accept=round(first["accept"], 3) if first["accept"] is not None else None,
                                        n_drafted=first.get("n_drafted"), n_accept=first.get("n_accept"),
                                        tokens_per_pass=round(first["tokens_per_pass"], 2)
                                        if first.get("tokens_per_pass") else None)  # fmt: skip
                    ratio = case[method]["tok_s"]["median"] / case["plain"]["tok_s"]["median"]
                    case[method]["vs_plain"] = round(ratio, 3)
                    plain_text, text = runs["plain"][0]["text"], first["text"]
                    shared = len(os.path.commonprefix([plain_text, text]))
                    # llama.cpp is not batch-invariant: does the speculative output equal its plain output?
                    case[method]["same_text_as_plain"] = shared >= min(len(plain_text), len(text))
                    case[method]["chars_shared_with_plain"] = [shared, len(plain_text)]
                    if method != "lookup_d0" and "lookup_d0" in runs:  # the same loop without drafts
                        base = runs["lookup_d0"][0]["text"]
                        shared = len(os.path.commonprefix([base, text]))
                        case[method]["same_text_as_lookup_d0"] = shared >= min(len(base), len(text))
            out.setdefault(task, {})[str(threads)] = case
            line = f"  {task:9s} t={threads} plain {case['plain']['tok_s']['median']:7.1f} tok/s"
            line += "".join(f", {m} {case[m]['tok_s']['median']:7.1f} ({case[m]['vs_plain']:.2f}x, accept "
                            f"{case[m]['accept']}, same text {case[m]['same_text_as_plain']})" for m in runs
                            if m != "plain")  # fmt: skip
            print(line, file=sys.stderr, flush=True)
    return out


def measure_file(name: str, args, tools: dict, workdir: Path) -> dict:
    path = resolve(name)
    print(f"{name}: {path} ({path.stat().st_size / 1e9:.2f} GB), load {load_average()}", file=sys.stderr, flush=True)
    entry: dict = {"name": name, "file": str(path), "file_gb": round(path.stat().st_size / 1e9, 3),
                   "tensor_types": tensor_types(path), "load_average_before": load_average()}  # fmt: skip
    began = time.perf_counter()
    bench = run_bench(path, args.threads, tuple(args.prefill), args.bench_tokens, args.bench_repetitions, tools=tools)
    entry["bench"] = {
        "command": " ".join(bench["command"]),
        "by_threads": {
            str(t): {
                "decode_tok_s": round(v.get("decode_tok_s", float("nan")), 2),
                "decode_stddev": round(v.get("decode_stddev", float("nan")), 2),
                "prefill_tok_s": {str(n): round(x, 1) for n, x in v["prefill_tok_s"].items()},
                "prefill_stddev": {str(n): round(x, 1) for n, x in v["prefill_stddev"].items()},
            }
            for t, v in bench["by_threads"].items()
        },
        "model": {
            k: bench["tests"][0].get(k)
            for k in ("model_type", "model_size", "model_n_params", "build_commit", "build_number")
        },
    }
    for t, v in entry["bench"]["by_threads"].items():
        prefill = ", ".join(f"pp{n} {x:.1f}" for n, x in v["prefill_tok_s"].items())
        print(f"  llama-bench t={t}: tg{args.bench_tokens} {v['decode_tok_s']:.1f} tok/s, {prefill}", file=sys.stderr)
    entry["tasks"] = measure_tasks(name, path, args, tools, workdir)
    entry["seconds"] = round(time.perf_counter() - began, 1)
    entry["load_average_after"] = load_average()
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), help="real, random-<size>-<quant>, path")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--task-threads", nargs="+", type=int, help="the task runs' threads (default: --threads)")
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--random-tasks", nargs="+", choices=list(TASKS), default=["edit"])
    parser.add_argument("--draft", nargs="+", type=int, default=[0, 3, 10], help="most tokens a lookup round drafts")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prefill", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--bench-tokens", type=int, default=64, help="llama-bench's -n (plain decoding)")
    parser.add_argument("--bench-repetitions", type=int, default=3, help="llama-bench's -r")
    parser.add_argument("--speculative", action="store_true", help="also llama-speculative-simple (n-gram, draft)")
    parser.add_argument("--spec-type", default="ngram-simple", help="llama-speculative-simple's n-gram drafter")
    parser.add_argument("--quick", action="store_true", help="SmolLM2, 1 thread, edit, 64 tokens, 1 repeat")
    parser.add_argument("--append", action="store_true", help="keep the other files' entries already in --out")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.files, args.threads, args.tasks, args.new_tokens = [REAL[0]], [1], ["edit"], 64
        args.repeats, args.bench_repetitions, args.bench_tokens = 1, 2, 32
    from benchmarks.harness import RESULTS, command_line, write_result

    tools = llama_cpp_tools()  # builds on first use (minutes), then instant
    build_info = json.loads((tools["llama-bench"].parent / "build-info.json").read_text())
    model, flags = cpu_model_and_flags()
    payload = {
        "what": " ".join(__doc__.split("\n\n")[1].split()),
        "cpu_model": model,
        "cpu_flags": flags,
        "uptime": os.popen("uptime").read().strip(),
        "tools": {"cache_key": cache_key(), "paths": {k: str(v) for k, v in tools.items()}, "build": build_info},
        "settings": {k: getattr(args, k) for k in ("threads", "task_threads", "tasks", "random_tasks", "new_tokens",
                                                   "draft", "repeats", "prefill", "bench_tokens", "bench_repetitions",
                                                   "speculative", "spec_type")},
        "files": [],
    }  # fmt: skip
    name = "peers_cpu_llama_cpp_quick" if args.quick else "peers_cpu_llama_cpp"
    out = Path(args.out) if args.out else RESULTS / f"{name}.json"
    earlier_entries: dict[str, dict] = {}
    if args.append and out.is_file():  # entries from earlier runs, each with its own command, kept until replaced
        earlier = json.loads(out.read_text())
        for entry in earlier["files"]:
            entry.setdefault("command", earlier["command"])
            entry.setdefault("measured", earlier["measured"])
            entry.setdefault("settings", earlier["settings"])
            earlier_entries[entry["name"]] = entry
    measured: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.files:
            entry = measure_file(name, args, tools, Path(workdir))
            entry.update(command=command_line("peers_cpu"), measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                         threads=args.threads, settings=payload["settings"])  # fmt: skip
            measured[name] = entry
            payload["files"] = list({**earlier_entries, **measured}.values())
            payload["uptime_end"] = os.popen("uptime").read().strip()
            write_result("peers_cpu_llama_cpp", command_line("peers_cpu"), payload, out)


if __name__ == "__main__":
    main()

"""This package's fast CPU path against llama.cpp on the same `.gguf` files, in one interleaved run.

    python -m benchmarks.vs_llama_cpp                       # both models, 3 tasks, 64 and 256 tokens, 1 and 2 threads
    python -m benchmarks.vs_llama_cpp --quick               # SmolLM2, edit, 32 tokens, 1 thread, 2 repeats
    python -m benchmarks.vs_llama_cpp --llama-tools --no-llama-cpp --tasks edit summarize --new-tokens 128 --threads 1

The package loads each file keeping its quantization (`quantized.load_gguf_quantized`: Q4_1 / Q4_K / Q6_K /
Q8_0 blocks repacked for PyTorch's int4 / int8 CPU kernels, batch-invariant attention) and decodes greedily,
plain and with prompt lookup (adaptive γ); llama.cpp (`llama-cpp-python`, built from PyPI's sdist on first
use and cached, see `benchmarks.real_models.llama_cpp_available`) decodes the same file, plain and with its
prompt lookup. EOS is ignored, so every method makes exactly the asked number of tokens. Methods alternate
round-robin `--repeats` times after one warm-up; medians with [min, max]. Reported per case: tokens/s of each
method, their ratios to llama.cpp's plain decoding, whether the package's lookup output equals its plain
output (exactness on the quantized path), how many leading tokens llama.cpp's output shares with the
package's (two kernels, two roundings: not expected to be equal), the verify pass over 4 and 5 tokens in
decode steps, and the bandwidth floor of a step (weight bytes / measured read bandwidth).

`--llama-tools` adds llama.cpp's own C++ tools (built by `benchmarks.harness.llama_cpp_tools`, no Python binding
needed): llama-completion (plain) and llama-lookup (prompt lookup, `LOOKUP_TOKENS` a round) on the same file and
the task in the file's chat template, alternated `--repeats` times with the package's plain and lookup runs;
decode-only rates on both sides (the tools' eval rates; the package's new tokens over its decode time, prefill
excluded), medians, and the package's lookup over llama-completion's plain rate.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable

import torch

import assisted_backends
from assisted_backends import AssistedGenerator
from assisted_backends.loading.models import load_tokenizer
from assisted_backends.quantized.linear import QuantizedLinear
from benchmarks.harness import RESULTS, command_line, ensure_real_gguf, interleaved, step_seconds, write_result
from benchmarks.harness.llama_cpp import llama_cpp_available
from benchmarks.harness.memory import read_bandwidth_gbs
from benchmarks.harness.tasks import TASKS, prompt_ids
from benchmarks.real_models import LOOKUP_TOKENS

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads from the weights: every buffer and parameter (the embedding is gathered, not read
    whole, unless the head shares it)."""
    tied = model.get_output_embeddings() is not None and isinstance(model.get_output_embeddings(), QuantizedLinear)
    embedding = model.get_input_embeddings()
    skip = set() if tied else {id(t) for t in [*embedding.parameters(), *embedding.buffers()]}
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()] if id(t) not in skip}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def methods(generator: AssistedGenerator, name: str, prompt: torch.Tensor, new_tokens: int, llama: bool):
    """{method: () -> list of new token ids}."""
    common = dict(max_new_tokens=new_tokens, eos_token_id=[], pad_token_id=0)

    def ours(**extra) -> Callable[[], list[int]]:
        def run() -> list[int]:
            return generator.generate(prompt, **common, **extra).sequences[0, prompt.shape[1] :].tolist()

        return run

    cases = {"ours_plain": ours(), "ours_lookup": ours(prompt_lookup_num_tokens=LOOKUP_TOKENS)}
    if llama:
        from benchmarks.real_models import llama_cpp_methods

        cases.update(llama_cpp_methods(name, None, prompt, new_tokens, True))  # the same file
    return cases


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def measure(name: str, generator: AssistedGenerator, tokenizer, task: str, new_tokens: int, threads: int, args):
    assisted_backends.set_threads(threads)  # fixed for the API too (its probe would pick its own count)
    prompt = prompt_ids(tokenizer, task)
    cases = methods(generator, name, prompt, new_tokens, args.llama_cpp)
    outputs = {case: run() for case, run in cases.items()}  # warm-up, and the tokens compared
    timings = interleaved(cases, args.repeats, warmup=0, order="rotate")
    median = timings.medians()
    rate = {case: round(new_tokens / seconds, 2) for case, seconds in median.items()}
    model = generator.model
    step = step_seconds(model, prompt, 1, repeats=9)
    result = {
        "model": name,
        "task": task,
        "threads": threads,
        "prompt_tokens": int(prompt.shape[1]),
        "new_tokens": new_tokens,
        "median_s": {case: round(seconds, 4) for case, seconds in median.items()},
        "spread_s": {case: [round(lo, 4), round(hi, 4)] for case, (lo, hi) in timings.spread().items()},
        "tokens_per_s": rate,
        "ours_lookup_identical_to_ours_plain": outputs["ours_lookup"] == outputs["ours_plain"],
        "lookup_stats": _lookup_stats(generator, prompt, new_tokens),
        "step_ms": round(1000 * step, 2),
        "verify_4_in_steps": round(step_seconds(model, prompt, 4, repeats=9) / step, 3),
        "verify_5_in_steps": round(step_seconds(model, prompt, 5, repeats=9) / step, 3),
    }
    if args.llama_tools:
        result["llama_tools"] = tool_rates(name, generator, prompt, task, new_tokens, threads, args.repeats)
    if "llama_cpp_plain" in rate:
        base = rate["llama_cpp_plain"]
        result["vs_llama_cpp_plain"] = {case: round(value / base, 3) for case, value in rate.items()}
        result["prefix_shared_with_llama_cpp"] = common_prefix(outputs["ours_plain"], outputs["llama_cpp_plain"])
    return result


def _lookup_stats(generator: AssistedGenerator, prompt: torch.Tensor, new_tokens: int) -> dict:
    """Acceptance of our lookup, and our decode-only rates (prefill excluded, as llama.cpp's tools report theirs:
    compare with `benchmarks.peers_cpu`'s llama-completion / llama-lookup figures)."""
    common = dict(max_new_tokens=new_tokens, eos_token_id=[], pad_token_id=0)
    stats = generator.generate(prompt, **common, prompt_lookup_num_tokens=LOOKUP_TOKENS).stats
    plain = generator.generate(prompt, **common).stats
    return {
        "alpha": round(stats.acceptance_rate or 0.0, 3),
        "tokens_per_round_E": round(stats.mean_accepted_length or 1.0, 3),
        "speculative_rounds": stats.speculative_rounds,
        "plain_rounds": stats.plain_rounds,
        "decode_tok_s": {"ours_plain": round(plain.new_tokens / plain.decode_s, 1),
                         "ours_lookup": round(stats.new_tokens / stats.decode_s, 1)},  # fmt: skip
        "prefill_tok_s": round(prompt.shape[1] / plain.prefill_s, 1),
    }


def tool_rates(name: str, generator: AssistedGenerator, prompt: torch.Tensor, task: str, new_tokens: int,
               threads: int, repeats: int) -> dict:  # fmt: skip
    """Decode-only tok/s, alternated `repeats` times: the package plain and with lookup, llama-completion and
    llama-lookup (C++ tools); medians [min, max] and the ratios to llama-completion's plain rate."""
    import statistics
    import tempfile
    from pathlib import Path

    from benchmarks.harness.llama_cpp_tools import llama_cpp_tools, run_completion, run_lookup
    from benchmarks.peers_cpu import rendered_prompt

    tools, path = llama_cpp_tools(), ensure_real_gguf(name)
    common = dict(max_new_tokens=new_tokens, eos_token_id=[], pad_token_id=0)
    rates: dict[str, list[float]] = {"ours_plain": [], "ours_lookup": [], "llama_completion": [], "llama_lookup": []}
    with tempfile.TemporaryDirectory() as workdir:
        prompt_file = Path(workdir) / "prompt.txt"
        prompt_file.write_text(rendered_prompt(path, task))
        for _ in range(repeats):
            for case, extra in (("ours_plain", {}), ("ours_lookup", {"prompt_lookup_num_tokens": LOOKUP_TOKENS})):
                stats = generator.generate(prompt, **common, **extra).stats
                rates[case].append(stats.new_tokens / stats.decode_s)
            plain = run_completion(path, prompt_file, new_tokens, threads, tools=tools)
            rates["llama_completion"].append(plain["decode_tok_s"])
            lookup = run_lookup(path, prompt_file, new_tokens, threads, LOOKUP_TOKENS, tools=tools)
            rates["llama_lookup"].append(lookup["decode_tok_s"])
    median = {case: statistics.median(values) for case, values in rates.items()}
    return {
        "decode_tok_s": {case: round(value, 1) for case, value in median.items()},
        "spread": {case: [round(min(v), 1), round(max(v), 1)] for case, v in rates.items()},
        "vs_llama_completion_plain": {case: round(v / median["llama_completion"], 3) for case, v in median.items()},
    }


def summary(r: dict) -> str:
    rate = r["tokens_per_s"]
    parts = [
        f"{r['model']:<22} {r['task']:<9} {r['new_tokens']:>3} tok {r['threads']}t",
        f"ours plain {rate['ours_plain']:6.1f} tok/s, lookup {rate['ours_lookup']:6.1f}",
    ]
    if "llama_cpp_plain" in rate:
        versus = r["vs_llama_cpp_plain"]
        parts.append(f"llama.cpp plain {rate['llama_cpp_plain']:6.1f}, lookup {rate.get('llama_cpp_lookup', 0):6.1f}")
        parts.append(
            f"ours/llama.cpp plain {versus['ours_plain']:.2f}x, lookup/llama.cpp plain {versus['ours_lookup']:.2f}x"
        )
    parts.append(f"verify 4/5 tokens {r['verify_4_in_steps']:.2f}/{r['verify_5_in_steps']:.2f} steps")
    if "llama_tools" in r:
        versus = r["llama_tools"]["vs_llama_completion_plain"]
        parts.append(f"C++ tools: ours plain {versus['ours_plain']:.2f}x, ours lookup {versus['ours_lookup']:.2f}x, "
                     f"llama-lookup {versus['llama_lookup']:.2f}x llama-completion")  # fmt: skip
    if not r["ours_lookup_identical_to_ours_plain"]:
        parts.append("LOOKUP NOT IDENTICAL")
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    parser.add_argument("--new-tokens", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp (else built once and cached)")
    parser.add_argument("--llama-tools", action="store_true", help="llama.cpp's C++ tools too (module docstring)")
    parser.add_argument("--quick", action="store_true", help="SmolLM2, edit, 32 tokens, 1 thread, 2 repeats")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.models, args.tasks, args.new_tokens, args.threads, args.repeats = [MODELS[0]], ["edit"], [32], [1], 2
    warnings.filterwarnings("ignore")
    args.llama_cpp = not args.no_llama_cpp and llama_cpp_available()
    out = args.out or RESULTS / ("vs_llama_cpp_quick.json" if args.quick else "vs_llama_cpp.json")
    bandwidth = read_bandwidth_gbs()
    results, loads = [], {}
    for name in args.models:
        began = time.perf_counter()
        path = ensure_real_gguf(name)
        generator = AssistedGenerator(str(path), device="cpu")
        tokenizer = load_tokenizer(str(path))
        file_mb = path.stat().st_size / 1e6
        resident = weight_bytes(generator.model)
        loads[name] = {
            "load_s": round(time.perf_counter() - began, 2),
            "file_mb": round(file_mb, 1),
            "weights_read_per_step_mb": round(resident / 1e6, 1),
            "bandwidth_floor_ms": round(1000 * resident / (bandwidth * 1e9), 2),
        }
        for threads in args.threads:
            for new_tokens in args.new_tokens:
                for task in args.tasks:
                    print(f"measuring {name} / {task} / {new_tokens} tokens / {threads} thread(s) ...", file=sys.stderr)
                    results.append(measure(name, generator, tokenizer, task, new_tokens, threads, args))
                    print(summary(results[-1]), flush=True)
                    payload = {
                        "what": __doc__.split("\n\n")[2].replace("\n", " "),
                        "read_bandwidth_gbs_1_thread": round(bandwidth, 2),
                        "loads": loads,
                        "llama_cpp": args.llama_cpp,
                        "results": results,
                    }
                    write_result("vs_llama_cpp", command_line("vs_llama_cpp"), payload, out)


if __name__ == "__main__":
    main()

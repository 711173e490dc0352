"""SmolLM2-135M's (or Gemma 3 270M's) `.gguf` step on the native decoder (`native.decoder_model`) against
today's path (transformers' modeling on the same kernels, batch-invariant attention) and llama.cpp's own llama-bench.

    python -m benchmarks.native_step [--model smollm2-135m-instruct] [--threads 1 2] [--repeats 7] [--tokens 32]
                                     [--no-llama-bench] [--output native_step]
    python -m benchmarks.native_step --memory    (resident memory per stage, in a fresh process)

Per thread count, interleaved medians: decode tokens/s (32 greedy steps after a 64-token prompt, the cache cut
back after each timed call), a verify pass over 5 and 8 rows in decode steps, prefill of a 128-token prompt in
tokens/s; the native step's split by the decoder's own clocks (inside the kernels' calls `block_linear` and
`row_attention`, the rest of the C++ step, Python around the call; the same for the native call alone, without the
timing loop's Python); resident memory beyond `import torch,
transformers` against the file; llama-bench tg64 / pp128 on the same file where its tools are built
(`benchmarks.harness.llama_cpp_tools`; this script never builds them).
"""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks.harness import command_line, ensure_real_gguf, interleaved, write_result

PROMPT = 64
PREFILL = 128


def _rss_mib() -> float:
    return _status_mib()["VmRSS"]


def _status_mib() -> dict[str, float]:
    """/proc/self/status's resident figures in MiB: VmRSS = RssAnon (heap, tensors) + RssFile (mapped files: code
    pages of the libraries as they are first run) + RssShmem."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if line.startswith(("VmRSS", "RssAnon", "RssFile")))
    return {name: int(value.split()[0]) / 1024 for name, value in fields.items()}


def _decoder(model, cache_factory, tokens: int):
    """One timed call: `tokens` greedy steps after the prompt, the cache cut back to it afterwards."""
    from assisted_backends import hf_compat

    cache = cache_factory()
    prompt = torch.arange(100, 100 + PROMPT)[None]
    with torch.inference_mode():
        first = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    start_token = first[:, -1:].argmax(-1)

    def run() -> None:
        token, position = start_token, PROMPT
        with torch.inference_mode():
            for _ in range(tokens):
                out = model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1,
                            cache_position=torch.tensor([position]),
                            position_ids=torch.tensor([[position]]))  # fmt: skip
                token, position = out.logits[:, -1:].argmax(-1), position + 1
        hf_compat.crop_dynamic_cache(cache, PROMPT)

    return run, cache


def _pass(model, cache, rows: int):
    """One forward of `rows` new tokens on top of the prompt's cache, cut back afterwards."""
    from assisted_backends import hf_compat

    tokens = torch.arange(200, 200 + rows)[None]

    def run() -> None:
        with torch.inference_mode():
            model(input_ids=tokens, past_key_values=cache, use_cache=True, cache_position=torch.arange(PROMPT,
                  PROMPT + rows), position_ids=torch.arange(PROMPT, PROMPT + rows)[None])  # fmt: skip
        hf_compat.crop_dynamic_cache(cache, PROMPT)

    return run


def _prefill(model, cache_factory):
    tokens = torch.arange(50, 50 + PREFILL)[None]

    def run() -> None:
        with torch.inference_mode():
            model(input_ids=tokens, past_key_values=cache_factory(), use_cache=True, logits_to_keep=1)

    return run


def _split(native, steps: int = 32) -> dict[str, float]:
    """Shares of the native decode step's wall time: inside the linear kernels' calls, inside the attention
    kernel's calls, the rest of the C++ step (norms, rotary, cache writes, SiLU, the embedding row), and Python
    around the call (the engine's runner not included), from the decoder's own clocks."""
    import time

    run, _ = _decoder(native, native.new_native_cache, steps)
    run()
    native._native.reset_timings()
    began = time.perf_counter_ns()
    run()
    wall = time.perf_counter_ns() - began
    linear, attention, inside, count = native._native.timings()
    return {"step_ms": wall / 1e6 / steps, "linear_kernels": linear / wall, "attention_kernel": attention / wall,
            "rest_of_the_cpp_step": (inside - linear - attention) / wall, "python_around_the_call": 1 - inside / wall,
            "steps_counted": count, "native_call_alone": _split_of_the_call(native, steps)}  # fmt: skip


def _split_of_the_call(native, steps: int) -> dict[str, float]:
    """The same shares for the native call alone (`step` called directly `steps` times at one position after the
    prompt, as the engine's runner calls it): what the step costs without the timing loop's own Python (argmax,
    building the next call's tensors)."""
    import time

    from assisted_backends.native import extension

    cache = native.new_native_cache()
    with torch.inference_mode():
        native(input_ids=torch.arange(100, 100 + PROMPT)[None], past_key_values=cache, logits_to_keep=1)
        cache.reserve(1, PROMPT + 1)  # what the module's forward does before its call
        token, position = torch.tensor([[5]]), torch.tensor([[PROMPT]])
        embedded = None if native._embed is None else native._embed(token).float()
        arguments = (token, position, PROMPT, cache.keys, cache.values, None, 1, extension.forced_isa(), embedded, [],
                     None)  # fmt: skip
        native._native.step(*arguments)
        native._native.reset_timings()
        began = time.perf_counter_ns()
        for _ in range(steps):
            native._native.step(*arguments)
        wall = time.perf_counter_ns() - began
    linear, attention, inside, _ = native._native.timings()
    return {"step_ms": wall / 1e6 / steps, "linear_kernels": linear / wall, "attention_kernel": attention / wall,
            "rest_of_the_cpp_step": (inside - linear - attention) / wall,
            "outside_the_cpp_clock": 1 - inside / wall}  # fmt: skip


def _llama_bench(path, threads: list[int]) -> dict | None:
    from benchmarks.harness.llama_cpp_tools import llama_cpp_tools, run_bench

    tools = llama_cpp_tools(build=False)
    if "llama-bench" not in tools:
        print("llama-bench is not built here (benchmarks.harness.llama_cpp_tools builds it): skipped")
        return None
    result = run_bench(path, threads=tuple(threads), prompts=(PREFILL,), gen=64, repetitions=3, tools=tools)
    return {"command": " ".join(result["command"]), "by_threads": result["by_threads"]}


def memory_stages(model: str) -> dict[str, float]:
    """Resident MiB added by each stage of a fresh process (run with --memory first thing): the package's modules
    and kernels, the model's load, the native decoder's build, a 64-token decode; against `import torch,
    transformers`. Each stage also split into anonymous memory (heap, tensors) and mapped files (`_anon`, `_file`:
    code pages of torch and the native libraries touched for the first time)."""
    import transformers  # noqa: F401

    stages: dict[str, float] = {}
    base = mark = _status_mib()

    def stage(name: str) -> None:
        nonlocal mark
        now = _status_mib()
        stages[f"{name}_mib"] = now["VmRSS"] - mark["VmRSS"]
        stages[f"{name}_anon_mib"] = now["RssAnon"] - mark["RssAnon"]
        stages[f"{name}_file_mib"] = now["RssFile"] - mark["RssFile"]
        mark = now

    stages["torch_and_transformers_mib"] = base["VmRSS"]
    from assisted_backends.native import extension
    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized.model import load_gguf_quantized

    extension.status()
    stage("package_modules_and_kernels")
    path = ensure_real_gguf(model)
    mark = _status_mib()
    loaded = load_gguf_quantized(path, tokenizer=False)
    stage("model_load")
    native = NativeCausalLM(loaded.reference)
    stage("native_decoder")
    cache = native.new_native_cache()
    with torch.inference_mode():
        native(torch.arange(10, 42)[None], past_key_values=cache, logits_to_keep=1)
        for _ in range(64):
            native(torch.tensor([[5]]), past_key_values=cache)
    stage("decode_64_tokens")
    stages["kv_cache_mib"] = sum(t.nbytes for t in cache.keys + cache.values) / (1 << 20)
    stages["weights_mib"] = loaded.weight_bytes() / (1 << 20)
    stages["file_mib"] = path.stat().st_size / (1 << 20)
    end = _status_mib()
    stages["beyond_imports_mib"] = end["VmRSS"] - base["VmRSS"]
    stages["beyond_imports_anon_mib"] = end["RssAnon"] - base["RssAnon"]
    stages["beyond_imports_file_mib"] = end["RssFile"] - base["RssFile"]
    stages["beyond_imports_over_file"] = stages["beyond_imports_mib"] / stages["file_mib"]
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a real model (smollm2-135m-instruct, "
                        "gemma-3-270m)")  # fmt: skip
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--no-llama-bench", action="store_true")
    parser.add_argument("--output", default=None, help="result name (default native_step)")
    parser.add_argument("--memory", action="store_true", help="only the resident memory of each stage")
    arguments = parser.parse_args()
    if arguments.memory:
        stages = memory_stages(arguments.model)
        print(stages)
        write_result(arguments.output or "native_step_memory", command_line("native_step"), {"stages": stages})
        return

    import transformers  # noqa: F401  (the imports' memory, before the model)

    imports_mib = _rss_mib()
    from assisted_backends import hf_compat
    from assisted_backends.backends.cpu import invariant_attention
    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized.model import load_gguf_quantized

    path = ensure_real_gguf(arguments.model)
    reference = load_gguf_quantized(path, tokenizer=False).reference
    invariant_attention.enable(reference)
    native = NativeCausalLM(reference)
    native_step, native_cache = _decoder(native, native.new_native_cache, arguments.tokens)
    native_step()
    loaded_mib = _rss_mib()
    per_threads = {}
    for threads in arguments.threads:
        torch.set_num_threads(threads)
        reference_step, reference_cache = _decoder(reference, lambda: hf_compat.new_dynamic_cache(reference),
                                                   arguments.tokens)  # fmt: skip
        native_step, native_cache = _decoder(native, native.new_native_cache, arguments.tokens)
        cases = {"native_decode": native_step, "reference_decode": reference_step}
        for rows in (1, 5, 8):
            cases[f"native_pass_{rows}"] = _pass(native, native_cache, rows)
            cases[f"reference_pass_{rows}"] = _pass(reference, reference_cache, rows)
        cases["native_prefill"] = _prefill(native, native.new_native_cache)
        cases["reference_prefill"] = _prefill(reference, lambda: hf_compat.new_dynamic_cache(reference))
        medians = interleaved(cases, arguments.repeats).medians()
        entry = {"load_average_1min": os.getloadavg()[0]}
        for path_name in ("native", "reference"):
            entry[path_name] = {
                "decode_tok_s": arguments.tokens / medians[f"{path_name}_decode"],
                "step_ms": 1000 * medians[f"{path_name}_decode"] / arguments.tokens,
                "verify_5_in_steps": medians[f"{path_name}_pass_5"] / medians[f"{path_name}_pass_1"],
                "verify_8_in_steps": medians[f"{path_name}_pass_8"] / medians[f"{path_name}_pass_1"],
                "prefill_tok_s": PREFILL / medians[f"{path_name}_prefill"],
            }
        entry["native_over_reference_decode"] = entry["native"]["decode_tok_s"] / entry["reference"]["decode_tok_s"]
        entry["native_split"] = _split(native)
        per_threads[threads] = entry
        print(threads, "threads:", entry)
    result = {
        "model": str(path.name),
        "file_mib": path.stat().st_size / (1 << 20),
        "rss_after_imports_mib": imports_mib,
        "rss_after_load_and_decode_mib": loaded_mib,
        "beyond_imports_over_file": (loaded_mib - imports_mib) / (path.stat().st_size / (1 << 20)),
        "note_memory": "the reference model (transformers' modules) is loaded too: the native path shares its "
        "weights, so the figure is the package's whole load, not the native decoder's alone",
        "by_threads": per_threads,
    }
    if not arguments.no_llama_bench:
        bench = _llama_bench(path, arguments.threads)
        if bench is not None:
            result["llama_bench"] = bench
            for threads, entry in per_threads.items():
                theirs = bench["by_threads"].get(threads, {})
                if theirs.get("decode_tok_s"):
                    entry["native_over_llama_bench_decode"] = entry["native"]["decode_tok_s"] / theirs["decode_tok_s"]
                if theirs.get("prefill_tok_s", {}).get(PREFILL):
                    ours = entry["native"]["prefill_tok_s"]
                    entry["native_over_llama_bench_prefill"] = ours / theirs["prefill_tok_s"][PREFILL]
    write_result(arguments.output or "native_step", command_line("native_step"), result)


if __name__ == "__main__":
    main()

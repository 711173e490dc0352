"""What opening a `.gguf` costs: peak resident memory beyond the imports, first run (repacking) and warm, what the
first run leaves on disk, and a warm process's time to its first token against llama.cpp's on the same file.

    python -m benchmarks.gguf_open                                  # SmolLM2, Gemma 3 270M, a random 3B Q4_0 file
    python -m benchmarks.gguf_open --files smollm2 --repeats 1      # smoke
    python -m benchmarks.gguf_open --route cli                      # run-assisted-generation -m FILE instead of the API

Every figure comes from a process of its own, started under `/usr/bin/time -f %M` (its peak resident set, from the
kernel's accounting of that process and the children it waited for: no polling, and not the parent's peak, which
Linux carries over a fork + exec into `getrusage` of the child). "Beyond the imports" subtracts the median peak of
a process that only runs `import torch, transformers, assisted_backends`. The first run uses an empty
`ASSISTED_BACKENDS_CACHE` (links to the already built kernels and native decoder only: their build is not part of
opening a file), so it repacks the file and builds its tokenizer; the warm runs reuse that cache.

Routes: `api` (default) is `AssistedGenerator(path, threads=T)` and `load_tokenizer(path)`, then
`generate(..., max_new_tokens=1)`; `cli` is
`run-assisted-generation -m FILE --prompt ... --max-new-tokens 1 --threads T`. Time to first token is the wall time
of such a process, start to exit (Python's imports included), against llama.cpp's `llama-completion -n 1` (or
`llama-simple`) on the same file and thread count, built by `benchmarks.harness.llama_cpp_tools`; the two alternate,
medians over `--repeats`. Prints which CPU ran it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "def parse(path):"
IMPORTS = "import torch, transformers, assisted_backends"


def _file(name: str) -> Path:
    if name == "smollm2":
        from benchmarks.harness import ensure_real_gguf

        return Path(ensure_real_gguf("smollm2-135m-instruct"))
    if name == "gemma3":
        from benchmarks.harness import ensure_real_gguf

        return Path(ensure_real_gguf("gemma-3-270m"))
    if name == "random-3b":
        from benchmarks.gguf_scaling import random_file

        return random_file("3B", "Q4_0")
    raise ValueError(f"--files: unknown file {name!r} (smollm2, gemma3, random-3b)")


def timed(command: list[str], env: dict | None = None, timeout: float = 3600) -> dict:
    """Run `command` under /usr/bin/time: {"peak_mb", "wall_s", "rc", "stdout", "stderr"}."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        began = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-o", report.name, "-f", "%M", *command], capture_output=True,
                              text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
        wall = time.perf_counter() - began
        lines = [line for line in Path(report.name).read_text().splitlines() if line.strip().isdigit()]
    peak = int(lines[-1]) / 1024 if lines else float("nan")
    return {"peak_mb": round(peak, 1), "wall_s": round(wall, 3), "rc": done.returncode, "stdout": done.stdout,
            "stderr": done.stderr}  # fmt: skip


def fresh_cache(root: Path) -> Path:
    """An empty package cache holding links to the built kernels and native decoder only."""
    from assisted_backends.cache_dir import cache_root

    root.mkdir(parents=True, exist_ok=True)
    for built in ("kernels", "decoder"):
        if (cache_root() / built).is_dir() and not (root / built).exists():
            (root / built).symlink_to(cache_root() / built, target_is_directory=True)
    return root


def left_on_disk(root: Path) -> dict[str, int]:
    """Files the runs wrote under the cache (the build links left out): {relative path: bytes}."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not any(part in ("kernels", "decoder") for part in path.relative_to(root).parts[:1]):
            found[str(path.relative_to(root))] = path.stat().st_size
    return found


def ours_command(route: str, path: Path, threads: int) -> list[str]:
    if route == "cli":
        return ["run-assisted-generation", "-m", str(path), "--prompt", PROMPT, "--max-new-tokens", "1",
                "--threads", str(threads)]  # fmt: skip
    return [sys.executable, "-m", "benchmarks.gguf_open", "--child", str(path), "--threads", str(threads)]


def llama_command(path: Path, threads: int) -> list[str] | None:
    from benchmarks.harness.llama_cpp_tools import llama_cpp_tools

    tools = llama_cpp_tools(build=False)
    if "llama-completion" in tools:
        return [str(tools["llama-completion"]), "-m", str(path), "-p", PROMPT, "-n", "1", "-t", str(threads),
                "-tb", str(threads), "-c", "512", "-no-cnv", "--temp", "0", "--no-warmup"]  # fmt: skip
    if "llama-simple" in tools:
        return [str(tools["llama-simple"]), "-m", str(path), "-n", "1", PROMPT]
    return None


def child(path: str, threads: int) -> None:
    """One process of the `api` route: imports, open the file, one greedy token; prints its own breakdown."""
    began = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from assisted_backends import AssistedGenerator
    from assisted_backends.loading.models import load_tokenizer

    imported = time.perf_counter()
    generator = AssistedGenerator(path, threads=threads)
    tokenizer = load_tokenizer(path)
    opened = time.perf_counter()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    result = generator.generate(ids, max_new_tokens=1, do_sample=False)
    done = time.perf_counter()
    print(json.dumps({"imports_s": round(imported - began, 3), "open_s": round(opened - imported, 3),
                      "first_token_s": round(done - opened, 3), "token": result.sequences[0, -1].item()}))  # fmt: skip


def measure(name: str, args) -> dict:
    path = _file(name)
    size_mb = path.stat().st_size / 2**20
    env = dict(os.environ)
    base = [timed([sys.executable, "-c", IMPORTS])["peak_mb"] for _ in range(args.repeats)]
    baseline = statistics.median(base)
    with tempfile.TemporaryDirectory(prefix="gguf_open-") as scratch:
        env["ASSISTED_BACKENDS_CACHE"] = str(fresh_cache(Path(scratch)))
        first = timed(ours_command(args.route, path, args.threads), env)
        if first["rc"] != 0:
            raise SystemExit(f"{name}: the first run failed ({first['rc']}): {first['stderr'][-2000:]}")
        disk = left_on_disk(Path(scratch))
        llama = llama_command(path, args.threads) if args.llama_cpp else None
        warm, theirs = [], []
        for _ in range(args.repeats):  # alternating, each in a fresh process
            warm.append(timed(ours_command(args.route, path, args.threads), env))
            if llama:
                theirs.append(timed(llama))
    failed = [run for run in warm + theirs if run["rc"] != 0]
    if failed:
        raise SystemExit(f"{name}: a warm run failed: {failed[0]['stderr'][-2000:]}")
    warm_peak = statistics.median(run["peak_mb"] for run in warm)
    row = {
        "file": path.name, "file_mib": round(size_mb, 1), "route": args.route, "threads": args.threads,
        "imports_peak_mib": round(baseline, 1),
        "first_peak_mib": first["peak_mb"], "warm_peak_mib": warm_peak,
        "first_beyond_imports_x_file": round((first["peak_mb"] - baseline) / size_mb, 2),
        "warm_beyond_imports_x_file": round((warm_peak - baseline) / size_mb, 2),
        "first_run_s": first["wall_s"],
        "on_disk_after_first_run": disk,
        "on_disk_x_file": round(sum(disk.values()) / 2**20 / size_mb, 2),
        "ttft_s": {"ours": statistics.median(run["wall_s"] for run in warm)},
        "ttft_s_all": {"ours": [run["wall_s"] for run in warm]},
    }  # fmt: skip
    if args.route == "api":
        parts = [json.loads(run["stdout"].strip().splitlines()[-1]) for run in warm]
        row["ours_breakdown_s"] = {key: statistics.median(part[key] for part in parts)
                                   for key in ("imports_s", "open_s", "first_token_s")}  # fmt: skip
    if theirs:
        row["ttft_s"]["llama_cpp"] = statistics.median(run["wall_s"] for run in theirs)
        row["ttft_s_all"]["llama_cpp"] = [run["wall_s"] for run in theirs]
        row["llama_cpp_peak_mib"] = statistics.median(run["peak_mb"] for run in theirs)
        row["ttft_ours_over_llama_cpp"] = round(row["ttft_s"]["ours"] / row["ttft_s"]["llama_cpp"], 2)
        row["llama_cpp_command"] = " ".join(llama)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=["smollm2", "gemma3", "random-3b"])
    parser.add_argument("--route", choices=("api", "cli"), default="api")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-llama-cpp", dest="llama_cpp", action="store_false")
    parser.add_argument("--output", default=None, help="result file (default benchmarks/results/gguf_open[_cli].json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads)
        return
    from benchmarks.harness import command_line, write_result
    from benchmarks.harness.llama_cpp_tools import cpu_model_and_flags

    print(f"CPU: {cpu_model_and_flags()[0]}, {os.cpu_count()} cores visible", flush=True)
    rows = [measure(name, args) for name in args.files]
    name = "gguf_open" + ("_cli" if args.route == "cli" else "")
    write_result(name, command_line("gguf_open"), {"rows": rows}, Path(args.output) if args.output else None)


if __name__ == "__main__":
    main()

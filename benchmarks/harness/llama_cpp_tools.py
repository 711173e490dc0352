"""llama.cpp's own C++ tools (llama-bench, llama-lookup, llama-speculative-simple, llama-completion, llama-simple):
their build, and parsers of what they print.

    python -m benchmarks.harness.llama_cpp_tools          # build (once) and print the tool paths

They are built with cmake from the llama.cpp source that llama-cpp-python's source distribution carries
(`vendor/llama.cpp`, the same llama.cpp the binding of `benchmarks.harness.llama_cpp` runs), with the CPU's own
instructions (`GGML_NATIVE`), static libraries, and cached under
`<cache>/llama_cpp_tools/<key>/bin`, where `<key>` names the llama-cpp-python version and a hash of the CPU's
instruction-set flags: a machine with other flags builds its own copy (native code would crash on a CPU without
them). The first call builds (about 5-10 minutes on 2 cores, longer on a busy machine; a progress line says so);
later calls return the cached paths at once.

The parsers (`parse_bench_json`, `parse_lookup`, `parse_speculative`, `parse_perf_context`) read the tools'
output; `run_bench`, `run_lookup`, `run_speculative` and `run_completion` run a tool on a `.gguf` file and parse it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from assisted_backends.cache_dir import cache_root
from benchmarks.harness.llama_cpp import LLAMA_CPP_VERSION

#: target name -> required? (a plain-generation tool is needed: llama-completion or llama-simple)
TARGETS = ("llama-bench", "llama-lookup", "llama-speculative-simple", "llama-completion", "llama-simple")
REQUIRED = ("llama-bench", "llama-lookup", "llama-speculative-simple")
#: the /proc/cpuinfo flags that change what `-march=native` code may use
_ISA_FLAG = re.compile(r"^(sse\S*|ssse3|avx\S*|amx\S*|fma|f16c|bmi\S*|popcnt|movbe|vpclmulqdq|gfni|vaes|sha_ni|abm)$")
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DGGML_OPENMP=ON",
)


class LlamaCppToolsError(RuntimeError):
    """The tools could not be found or built (the message says why and what to install)."""


def cpu_model_and_flags() -> tuple[str, list[str]]:
    """(the CPU's model name, its sorted instruction-set flags) from /proc/cpuinfo ("unknown", [] elsewhere)."""
    model, flags = "unknown", []
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        if found := re.search(r"^model name\s*:\s*(.+)$", text, re.M):
            model = found.group(1).strip()
        if found := re.search(r"^flags\s*:\s*(.+)$", text, re.M):
            flags = sorted(flag for flag in found.group(1).split() if _ISA_FLAG.match(flag))
    return model, flags


def cache_key() -> str:
    """`lcpp-<llama-cpp-python version>-<machine>-<10 hex digits of the CPU's instruction-set flags>`."""
    _, flags = cpu_model_and_flags()
    import platform

    digest = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:10]
    return f"lcpp-{LLAMA_CPP_VERSION}-{platform.machine()}-{digest}"


def tools_dir() -> Path:
    return cache_root() / "llama_cpp_tools" / cache_key()


def _source_dir() -> Path:
    """llama.cpp's source tree from llama-cpp-python's source distribution (downloaded with pip once, into
    `<cache>/llama_cpp_tools/src`)."""
    base = cache_root() / "llama_cpp_tools" / "src"
    tree = base / f"llama_cpp_python-{LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    base.mkdir(parents=True, exist_ok=True)
    archives = list(base.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"))
    if not archives:
        print(f"downloading llama-cpp-python {LLAMA_CPP_VERSION}'s sdist ...", file=sys.stderr, flush=True)
        download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(base),
                    f"llama-cpp-python=={LLAMA_CPP_VERSION}"]  # fmt: skip
        if subprocess.run(download).returncode != 0:
            raise LlamaCppToolsError(f"pip could not download llama-cpp-python=={LLAMA_CPP_VERSION}'s sdist")
        archives = list(base.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"))
    with tarfile.open(archives[0]) as archive:
        archive.extractall(base, filter="data") if hasattr(tarfile, "data_filter") else archive.extractall(base)
    if not (tree / "CMakeLists.txt").is_file():
        raise LlamaCppToolsError(f"{archives[0]} holds no vendor/llama.cpp")
    return tree


def _found_tools(directory: Path) -> dict[str, Path]:
    return {name: directory / name for name in TARGETS if (directory / name).is_file()}


@contextlib.contextmanager
def _lock(path: Path):
    """An exclusive lock on `path` (two processes building at once wait for each other)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def llama_cpp_tools(build: bool = True, jobs: int | None = None) -> dict[str, Path]:
    """{tool name: path} of llama.cpp's C++ tools for this CPU, building them on first use (see the module's
    docstring). Raises `LlamaCppToolsError` if cmake or a C++ compiler is missing, or the build fails."""
    directory = tools_dir()
    bin_dir = directory / "bin"
    tools = _found_tools(bin_dir)
    if all(name in tools for name in REQUIRED) or not build:
        return tools
    with _lock(directory / ".lock"):
        tools = _found_tools(bin_dir)  # another process may have built them while we waited
        if all(name in tools for name in REQUIRED):
            return tools
        _build(directory, jobs or os.cpu_count() or 1)
        tools = _found_tools(bin_dir)
    missing = [name for name in REQUIRED if name not in tools]
    if missing or not ({"llama-completion", "llama-simple"} & set(tools)):
        raise LlamaCppToolsError(f"the build in {directory} made no {missing or 'plain generation tool'}")
    return tools


def _build(directory: Path, jobs: int) -> None:
    cmake = shutil.which("cmake")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cmake is None or compiler is None:
        raise LlamaCppToolsError(
            "building llama.cpp's tools needs cmake and a C++ compiler "
            f"(cmake: {cmake or 'missing'}, C++ compiler: {compiler or 'missing'}); "
            "install them (`apt-get install cmake g++` or `pip install cmake`)"
        )
    source = _source_dir()
    build_dir = directory / "build"
    key = directory.name
    print(f"building llama.cpp's tools ({', '.join(TARGETS)}) from llama-cpp-python {LLAMA_CPP_VERSION}'s "
          f"vendor/llama.cpp into {directory} for this CPU ({key}; once, about 5-10 minutes on 2 cores) ...",
          file=sys.stderr, flush=True)  # fmt: skip
    log = directory / "build.log"
    directory.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        configure = [cmake, "-S", str(source), "-B", str(build_dir), *CMAKE_OPTIONS]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        if subprocess.run(configure, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
            raise LlamaCppToolsError(f"cmake's configure step failed: see {log}")
        available = [name for name in TARGETS if _has_target(build_dir, name)]
        compile_ = [cmake, "--build", str(build_dir), "--parallel", str(jobs), "--target", *available]
        if subprocess.run(compile_, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
            raise LlamaCppToolsError(f"building llama.cpp's tools failed: see the end of {log}")
    staging = directory / "bin.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name in available:
        built = next((p for p in (build_dir / "bin" / name, build_dir / name) if p.is_file()), None)
        if built is not None:
            shutil.copy2(built, staging / name)
    (staging / "build-info.json").write_text(json.dumps({
        "llama_cpp_python": LLAMA_CPP_VERSION, "cmake_options": list(CMAKE_OPTIONS), "key": key,
        "cpu": cpu_model_and_flags()[0], "flags": cpu_model_and_flags()[1]}, indent=1))  # fmt: skip
    shutil.rmtree(directory / "bin", ignore_errors=True)
    staging.rename(directory / "bin")
    shutil.rmtree(build_dir, ignore_errors=True)  # ~1 GB of objects; the static binaries stand alone
    print(f"llama.cpp's tools are in {directory / 'bin'}", file=sys.stderr, flush=True)


def _has_target(build_dir: Path, name: str) -> bool:
    """Whether the configured build defines the target `name` (llama-cli / llama-completion move between versions)."""
    done = subprocess.run(["cmake", "--build", str(build_dir), "--target", "help"], capture_output=True, text=True)
    return re.search(rf"(^|[\s:]){re.escape(name)}(:|\s|$)", done.stdout, re.M) is not None


# --- parsers -----------------------------------------------------------------------------------------------

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)"


def _float(text: str) -> float | None:
    value = float(text)
    return None if value != value or value in (float("inf"), float("-inf")) else value


def parse_bench_json(text: str) -> list[dict]:
    """llama-bench's `-o json` output (a JSON array, possibly with log lines around it) -> one dict per test:
    threads, n_prompt, n_gen, n_depth, avg_ts, stddev_ts, samples_ts, test ("pp128" / "tg64" / "pp512+tg64"), and
    the model/build fields llama-bench reports (model_type, model_size, model_n_params, cpu_info, build_commit,
    build_number, type_k, n_batch)."""
    decoder, tests, start = json.JSONDecoder(), None, text.find("[")
    while start >= 0:  # the first '[' that opens a JSON array of objects (log lines may hold brackets too)
        try:
            found, _ = decoder.raw_decode(text, start)
        except ValueError:
            found = None
        if isinstance(found, list) and found and all(isinstance(item, dict) for item in found):
            tests = found
            break
        start = text.find("[", start + 1)
    if tests is None:
        raise ValueError("no JSON array of tests in llama-bench's output")
    rows = []
    for test in tests:
        n_prompt, n_gen = int(test.get("n_prompt", 0)), int(test.get("n_gen", 0))
        row = {
            "threads": int(test["n_threads"]),
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": int(test.get("n_depth", 0)),
            "test": _test_name(n_prompt, n_gen, int(test.get("n_depth", 0))),
            "avg_ts": float(test["avg_ts"]),
            "stddev_ts": float(test.get("stddev_ts", 0.0)),
            "samples_ts": [float(x) for x in test.get("samples_ts", [])],
        }
        for field in ("model_type", "model_size", "model_n_params", "cpu_info", "build_commit", "build_number",
                      "type_k", "n_batch", "n_ubatch"):  # fmt: skip
            if field in test:
                row[field] = test[field]
        rows.append(row)
    return rows


def _test_name(n_prompt: int, n_gen: int, n_depth: int) -> str:
    name = "+".join(part for part in (f"pp{n_prompt}" if n_prompt else "", f"tg{n_gen}" if n_gen else "") if part)
    return f"{name} @ d{n_depth}" if n_depth else name


def parse_bench_markdown(text: str) -> list[dict]:
    """llama-bench's default table (`| model | size | params | backend | threads | test | t/s |`) -> the same
    dicts as `parse_bench_json` (threads, n_prompt, n_gen, n_depth, test, avg_ts, stddev_ts; samples empty)."""
    header, rows = None, []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if "test" in cells and "t/s" in cells:
            header = cells
            continue
        if header is None or len(cells) != len(header) or set(cells[0]) <= set("-: "):
            continue
        record = dict(zip(header, cells))
        found = re.fullmatch(r"(?:pp(\d+))?\+?(?:tg(\d+))?(?:\s*@\s*d(\d+))?", record["test"])
        speed = re.fullmatch(_NUMBER + r"\s*(?:±\s*" + _NUMBER + r")?", record["t/s"])
        if not found or not speed:
            continue
        n_prompt, n_gen, n_depth = (int(g) if g else 0 for g in found.groups())
        rows.append({
            "threads": int(record.get("threads", 0) or 0),
            "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth,
            "test": _test_name(n_prompt, n_gen, n_depth),
            "avg_ts": float(speed.group(1)), "stddev_ts": float(speed.group(2) or 0.0), "samples_ts": [],
        })  # fmt: skip
    if not rows:
        raise ValueError("no test rows in llama-bench's table")
    return rows


def parse_bench(text: str) -> list[dict]:
    """llama-bench's output in `-o json` or its default markdown table."""
    try:
        return parse_bench_json(text)
    except (ValueError, KeyError):
        return parse_bench_markdown(text)


def summarize_bench(rows: list[dict]) -> dict[int, dict]:
    """{threads: {"decode_tok_s": tg's avg, "decode_stddev": ..., "prefill_tok_s": {n_prompt: avg}, ...}}."""
    out: dict[int, dict] = {}
    for row in rows:
        entry = out.setdefault(row["threads"], {"prefill_tok_s": {}, "prefill_stddev": {}})
        if row["n_gen"] and not row["n_prompt"]:
            entry["decode_tok_s"], entry["decode_stddev"] = row["avg_ts"], row["stddev_ts"]
            entry["decode_tokens"] = row["n_gen"]
        elif row["n_prompt"] and not row["n_gen"]:
            entry["prefill_tok_s"][row["n_prompt"]] = row["avg_ts"]
            entry["prefill_stddev"][row["n_prompt"]] = row["stddev_ts"]
    return out


def parse_perf_context(text: str) -> dict:
    """The last `prompt eval time = ... / N tokens` and `eval time = ... / N runs` lines (llama.cpp's
    `llama_perf_context_print` / `common_perf_print`) -> prompt_eval_ms, prompt_tokens, prompt_tok_s, eval_ms,
    eval_runs, eval_tok_s. llama.cpp counts a batch of more than one token as prompt tokens and a one-token batch
    as a run, so for plain decoding eval_runs is the tokens decoded after the first."""
    out: dict = {}
    prompt = re.findall(r"prompt eval time\s*=\s*" + _NUMBER + r"\s*ms\s*/\s*(\d+)\s*tokens", text)
    if prompt:
        ms, tokens = prompt[-1]
        out.update(prompt_eval_ms=_float(ms), prompt_tokens=int(tokens))
        out["prompt_tok_s"] = 1e3 * int(tokens) / float(ms) if float(ms) > 0 else None
    runs = re.findall(r"(?<!prompt )eval time\s*=\s*" + _NUMBER + r"\s*ms\s*/\s*(\d+)\s*runs", text)
    if runs:
        ms, count = runs[-1]
        out.update(eval_ms=_float(ms), eval_runs=int(count))
        out["eval_tok_s"] = 1e3 * int(count) / float(ms) if float(ms) > 0 else None
    sampling = re.findall(r"sampling time\s*=\s*" + _NUMBER + r"\s*ms", text)
    if sampling:
        out["sampling_ms"] = _float(sampling[-1])
    return out


def parse_lookup(text: str) -> dict:
    """llama-lookup's (or llama-speculative-simple's) printed summary -> prompt_tokens, prompt_s, prompt_tok_s,
    new_tokens, decode_s, decode_tok_s, n_draft, n_drafted, n_accept, accept (fraction of drafted tokens
    accepted; None when nothing was drafted), target (the target context's perf lines, see
    `parse_perf_context`), target_passes (rounds) and tokens_per_pass. The prompt speed is recomputed from
    the token count: the tools print the prompt length after decoding as its numerator."""
    encoded = re.search(r"encoded\s+(\d+)\s+tokens in\s+" + _NUMBER + r"\s+seconds", text)
    decoded = re.search(r"decoded\s+(\d+)\s+tokens in\s+" + _NUMBER + r"\s+seconds", text)
    if not decoded:
        raise ValueError("no 'decoded N tokens in S seconds' line in the tool's output")
    out: dict = {}
    if encoded:
        tokens, seconds = int(encoded.group(1)), float(encoded.group(2))
        out.update(prompt_tokens=tokens, prompt_s=seconds, prompt_tok_s=tokens / seconds if seconds > 0 else None)
    tokens, seconds = int(decoded.group(1)), float(decoded.group(2))
    out.update(new_tokens=tokens, decode_s=seconds, decode_tok_s=tokens / seconds if seconds > 0 else None)
    for name in ("n_draft", "n_predict", "n_drafted", "n_accept"):  # lines may carry a log prefix ("0.03.873 I ")
        found = re.search(rf"(?:^|\s){name}\s*=\s*(-?\d+)", text, re.M)
        if found:
            out[name] = int(found.group(1))
    if out.get("n_drafted"):
        out["accept"] = out.get("n_accept", 0) / out["n_drafted"]
    else:
        out["accept"] = None
    target = text.rsplit("target:", 1)[1] if "target:" in text else text
    out["target"] = parse_perf_context(target)
    # One target pass a round, and each round yields its accepted draft tokens plus one: passes = n_predict -
    # n_accept. (The perf lines cannot say it: llama.cpp files every batch of more than one token under
    # "prompt eval", so a verify pass is counted there as tokens, a one-token pass under "eval" as a run.)
    predicted = out.get("n_predict", tokens)
    passes = predicted - out["n_accept"] if "n_accept" in out else None
    out["target_passes"] = passes
    out["tokens_per_pass"] = predicted / passes if passes else None
    return out


def parse_speculative(text: str) -> dict:
    """llama-speculative-simple prints the same summary as llama-lookup (plus a `draft:` perf section)."""
    out = parse_lookup(text)
    if "draft:" in text and "target:" in text:
        out["draft"] = parse_perf_context(text.rsplit("draft:", 1)[1].split("target:", 1)[0])
    return out


def parse_completion(text: str) -> dict:
    """llama-completion's (or llama-cli's) perf lines -> prompt_tokens, prompt_tok_s, new_tokens (eval runs),
    decode_tok_s."""
    perf = parse_perf_context(text)
    if "eval_runs" not in perf:
        raise ValueError("no 'eval time = ... runs' line in the tool's output")
    return {"prompt_tokens": perf.get("prompt_tokens"), "prompt_tok_s": perf.get("prompt_tok_s"),
            "new_tokens": perf["eval_runs"], "decode_tok_s": perf["eval_tok_s"], "perf": perf}  # fmt: skip


# --- runners -----------------------------------------------------------------------------------------------


def _run(command: list[str], timeout: float) -> tuple[str, str]:
    """Run a tool: (its stdout then stderr as one text, its stdout); RuntimeError with the tail on failure."""
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, errors="replace",
                          timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    text = done.stdout + "\n" + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} exited with {done.returncode}: {text[-2000:]}")
    return text, done.stdout


def generated_text(stdout: str, prompt: str | None = None) -> str:
    """The generated text in a tool's stdout: after the echoed `prompt` where it is echoed (llama-lookup and
    llama-speculative-simple print the prompt first), without the blank lines around it and the log lines
    (`name: ...` / timestamped) that may share the stream."""
    if prompt:
        if prompt not in stdout:  # a SentencePiece vocabulary without byte decoding echoes spaces as "▁"
            stdout = stdout.replace("\u2581", " ")
        if prompt in stdout:
            stdout = stdout.split(prompt, 1)[1]
    return stdout.strip("\n")


def bench_command(path: str | Path, threads=(1, 2), prompts=(128, 512), gen: int = 64, repetitions: int = 5,
                  tools: dict | None = None) -> list[str]:  # fmt: skip
    tools = tools or llama_cpp_tools()
    command = [str(tools["llama-bench"]), "-m", str(path), "-t", ",".join(map(str, threads)), "-r", str(repetitions),
               "-o", "json"]  # fmt: skip
    command += ["-p", ",".join(map(str, prompts))] if prompts else ["-p", "0"]
    command += ["-n", str(gen)] if gen else ["-n", "0"]
    return command


def run_bench(path: str | Path, threads=(1, 2), prompts=(128, 512), gen: int = 64, repetitions: int = 5,
              tools: dict | None = None, timeout: float = 7200) -> dict:  # fmt: skip
    """llama-bench on `path`: {"command": [...], "tests": parse_bench rows, "by_threads": summarize_bench}:
    plain decoding tok/s (tg`gen`, from an empty context) and prompt tok/s (pp128, pp512) per thread count,
    each the mean of `repetitions` runs after a warm-up."""
    command = bench_command(path, threads, prompts, gen, repetitions, tools)
    rows = parse_bench(_run(command, timeout)[0])
    return {"command": command, "tests": rows, "by_threads": summarize_bench(rows)}


_GREEDY = ["--temp", "0", "--top-k", "1", "--seed", "0", "--ignore-eos"]


def lookup_command(path: str | Path, prompt_file: str | Path, new_tokens: int, threads: int, draft: int = 10,
                   context: int = 4096, tools: dict | None = None) -> list[str]:  # fmt: skip
    tools = tools or llama_cpp_tools()
    return [str(tools["llama-lookup"]), "-m", str(path), "-f", str(prompt_file), "-n", str(new_tokens),
            "-t", str(threads), "-tb", str(threads), "-c", str(context), "--spec-draft-n-max", str(draft),
            *_GREEDY]  # fmt: skip


def run_lookup(path: str | Path, prompt_file: str | Path, new_tokens: int, threads: int, draft: int = 10,
               context: int = 4096, tools: dict | None = None, timeout: float = 3600) -> dict:  # fmt: skip
    """llama-lookup (prompt-lookup decoding, n-grams of the context, up to `draft` tokens a round; greedy, EOS
    ignored) on `path` with the prompt in `prompt_file`: `parse_lookup`'s fields plus the command. It stops on
    the round that passes `new_tokens`, so new_tokens may exceed the request by up to `draft`."""
    command = lookup_command(path, prompt_file, new_tokens, threads, draft, context, tools)
    text, stdout = _run(command, timeout)
    return {"command": command, **parse_lookup(text), "text": generated_text(stdout, Path(prompt_file).read_text())}


def run_speculative(path: str | Path, prompt_file: str | Path, new_tokens: int, threads: int, draft: int = 10,
                    draft_model: str | Path | None = None, spec_type: str | None = None, context: int = 4096,
                    tools: dict | None = None, timeout: float = 3600) -> dict:  # fmt: skip
    """llama-speculative-simple: with `draft_model` (same vocabulary), or an n-gram `spec_type` such as
    "ngram-simple" / "ngram-map-k" / "ngram-cache" without one; greedy, EOS ignored. `parse_speculative`'s
    fields plus the command."""
    tools = tools or llama_cpp_tools()
    command = [str(tools["llama-speculative-simple"]), "-m", str(path), "-f", str(prompt_file), "-n", str(new_tokens),
               "-t", str(threads), "-tb", str(threads), "-c", str(context), "--spec-draft-n-max", str(draft),
               *_GREEDY]  # fmt: skip
    if draft_model:
        command += ["-md", str(draft_model), "-td", str(threads), "-tbd", str(threads)]
    if spec_type or draft_model:
        command += ["--spec-type", spec_type or "draft-simple"]
    text, stdout = _run(command, timeout)
    prompt = Path(prompt_file).read_text()
    return {"command": command, **parse_speculative(text), "text": generated_text(stdout, prompt)}


def run_completion(path: str | Path, prompt_file: str | Path, new_tokens: int, threads: int, context: int = 4096,
                   tools: dict | None = None, timeout: float = 3600) -> dict:  # fmt: skip
    """Plain greedy generation of `new_tokens` (EOS ignored) after the prompt in `prompt_file` with
    llama-completion (no chat template applied: the file holds the rendered prompt): `parse_completion`'s
    fields plus the command."""
    tools = tools or llama_cpp_tools()
    tool = tools.get("llama-completion")
    if tool is None:
        raise LlamaCppToolsError("no llama-completion was built")
    command = [str(tool), "-m", str(path), "-f", str(prompt_file), "-n", str(new_tokens), "-t", str(threads),
               "-tb", str(threads), "-c", str(context), "-no-cnv", "--no-display-prompt", *_GREEDY]  # fmt: skip
    text, stdout = _run(command, timeout)
    return {"command": command, **parse_completion(text), "text": generated_text(stdout)}


if __name__ == "__main__":
    for tool, location in llama_cpp_tools().items():
        print(f"{tool}\t{location}")

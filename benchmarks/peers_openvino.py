"""OpenVINO GenAI on SmolLM2-135M-Instruct (int4): plain and prompt-lookup decoding tok/s on the package's tasks.

    python -m benchmarks.peers_openvino --setup        # once: a venv under ~/.cache with OpenVINO GenAI (~3 min)
    ~/.cache/ov-venv-peers/bin/python -m benchmarks.peers_openvino
    ~/.cache/ov-venv-peers/bin/python -m benchmarks.peers_openvino --quick   # edit, 1 thread, 64 tokens

OpenVINO GenAI must not go into the package's own environment: optimum-intel asks for torchvision, whose
install replaces the CPU torch with a CUDA build. `--setup` makes a venv of its own (`~/.cache/ov-venv-peers`):
torch 2.13.0 CPU first, then openvino / openvino-genai / openvino-tokenizers 2026.4.1, nncf 3.4.0, transformers
5.5.4, then optimum-intel 2.2.0 without its dependencies. The model folder is the package's conversion of the
`.gguf` (`python -m assisted_backends.loading.real_weights smollm2-135m-instruct`, run with the system python),
exported with `optimum-cli export openvino --weight-format int4 --group-size 32 --ratio 1.0 --sym` and its
tokenizer with `convert_tokenizer --with-detokenizer`, cached under `<cache>/openvino/`. Each task's prompt goes
through the model's chat template; greedy decoding of `--new-tokens` tokens with EOS ignored, plain and with
prompt lookup (`num_assistant_tokens`, `max_ngram_size`), in OpenVINO's default CPU precision (bf16 inference,
u8 KV cache, dynamic activation quantization) and in its exact f32 settings; `--repeats` alternating runs,
medians, and whether lookup's output equals plain's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VENV = Path.home() / ".cache" / "ov-venv-peers"
PINS = ["openvino==2026.4.1", "openvino-genai==2026.4.1", "openvino-tokenizers==2026.4.1", "nncf==3.4.0",
        "transformers==5.5.4", "optimum", "accelerate", "sentencepiece"]  # fmt: skip
EXACT = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
MODEL = "smollm2-135m-instruct"


def cache_root() -> Path:
    if os.environ.get("ASSISTED_BACKENDS_CACHE"):
        return Path(os.environ["ASSISTED_BACKENDS_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "assisted_backends"


def setup() -> None:
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build (the machine's pip config finds it)
    subprocess.run([*pip, *PINS], check=True)
    subprocess.run([*pip, "--no-deps", "optimum-intel==2.2.0"], check=True)
    print(f"run: {VENV / 'bin' / 'python'} -m benchmarks.peers_openvino")


def _system_python() -> str:
    """The first python3 on PATH outside this venv (the package's own environment, transformers 5.x)."""
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(entry) / "python3"
        if candidate.is_file() and VENV not in candidate.resolve().parents and Path(entry) != VENV / "bin":
            return str(candidate)
    raise SystemExit("set SYSTEM_PYTHON to the python that has assisted_backends installed")


def exported() -> Path:
    """The int4 OpenVINO IR folder (with tokenizer and detokenizer) for SmolLM2, exported once."""
    out = cache_root() / "openvino" / f"{MODEL}-int4-g32-sym"
    if (out / "openvino_model.xml").is_file() and (out / "openvino_detokenizer.xml").is_file():
        return out
    system_python = os.environ.get("SYSTEM_PYTHON") or _system_python()
    converted = subprocess.run([system_python, "-m", "assisted_backends.loading.real_weights", MODEL],
                               capture_output=True, text=True, check=True)  # fmt: skip
    source = converted.stdout.strip().splitlines()[-1].split("\t")[-1]  # "name<TAB>folder"
    print(f"exporting {source} to {out} (int4, group 32, symmetric) ...", file=sys.stderr, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    cli = [str(Path(sys.executable).parent / "optimum-cli"), "export", "openvino", "--model", source,
           "--weight-format", "int4", "--group-size", "32", "--ratio", "1.0", "--sym",
           "--task", "text-generation-with-past", str(out)]  # fmt: skip
    subprocess.run(cli, check=True)
    tokenizer = [str(Path(sys.executable).parent / "convert_tokenizer"), source, "--with-detokenizer", "-o", str(out)]
    subprocess.run(tokenizer, check=True)
    return out


def prompt_text(folder: Path, task: str) -> str:
    from transformers import AutoTokenizer

    from benchmarks.harness.tasks import TASKS

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.apply_chat_template([{"role": "user", "content": TASKS[task]}], add_generation_prompt=True,
                                         tokenize=False)  # fmt: skip


def generate_once(ov_genai, pipe, text: str, args, lookup: bool) -> tuple[str, dict]:
    """One greedy generation of `args.new_tokens` tokens (EOS ignored): (its text, its timings)."""
    config = ov_genai.GenerationConfig()
    config.max_new_tokens, config.ignore_eos, config.apply_chat_template = args.new_tokens, True, False
    if lookup:
        config.num_assistant_tokens, config.max_ngram_size = args.lookup_tokens, args.ngram
    result = pipe.generate([text], config)
    metrics = result.perf_metrics
    timings = {"tok_s": metrics.get_throughput().mean, "ttft_ms": metrics.get_ttft().mean,
               "tokens": metrics.get_num_generated_tokens(),
               "input_tokens": metrics.get_num_input_tokens()}  # fmt: skip
    return result.texts[0], timings


def summary(runs: list[dict]) -> dict:
    speeds = [r["tok_s"] for r in runs]
    prefill = [1e3 * r["input_tokens"] / r["ttft_ms"] for r in runs]
    return {"tok_s": round(statistics.median(speeds), 2), "spread": [round(min(speeds), 2), round(max(speeds), 2)],
            "ttft_ms": round(statistics.median(r["ttft_ms"] for r in runs), 1),
            "prefill_tok_s": round(statistics.median(prefill), 1), "tokens": runs[0]["tokens"],
            "input_tokens": runs[0]["input_tokens"]}  # fmt: skip


def measure(ov_genai, folder: Path, precision: str, properties: dict, threads: int, args) -> list[dict]:
    plain = ov_genai.LLMPipeline(str(folder), "CPU", INFERENCE_NUM_THREADS=threads, **properties)
    lookup = ov_genai.LLMPipeline(str(folder), "CPU", INFERENCE_NUM_THREADS=threads, prompt_lookup=True, **properties)
    rows = []
    for task in args.tasks:
        text = prompt_text(folder, task)
        outputs, runs = {}, {"plain": [], "lookup": []}
        for round_ in range(args.repeats + 1):  # alternating; the first round warms up
            for name, pipe in (("plain", plain), ("lookup", lookup)):
                outputs[name], timings = generate_once(ov_genai, pipe, text, args, lookup=name == "lookup")
                if round_:
                    runs[name].append(timings)
        row = {"precision": precision, "threads": threads, "task": task, **{k: summary(v) for k, v in runs.items()}}
        row["lookup_vs_plain"] = round(row["lookup"]["tok_s"] / row["plain"]["tok_s"], 3)
        row["lookup_same_text_as_plain"] = outputs["lookup"] == outputs["plain"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--tasks", nargs="+", default=["edit", "summarize", "open"])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lookup-tokens", type=int, default=10)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.setup:
        setup()
        return
    if args.quick:
        args.threads, args.tasks, args.new_tokens, args.repeats = [1], ["edit"], 64, 1
    import openvino
    import openvino_genai as ov_genai

    folder = exported()
    rows = []
    for precision, properties in (("default", {}), ("exact_f32", EXACT)):
        for threads in args.threads:
            rows += measure(ov_genai, folder, precision, properties, threads, args)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    document = {
        "command": f"{VENV}/bin/python -m benchmarks.peers_openvino" + "".join(f" {a}" for a in sys.argv[1:]),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "uptime": os.popen("uptime").read().strip(),
        "cpu_model": cpu,
        "versions": {"openvino": openvino.__version__, "openvino_genai": ov_genai.__version__},
        "model": str(folder),
        "settings": {k: getattr(args, k) for k in ("threads", "tasks", "new_tokens", "repeats", "lookup_tokens",
                                                   "ngram")},
        "exact_f32_properties": EXACT,
        "results": rows,
    }  # fmt: skip
    name = "peers_cpu_openvino_quick.json" if args.quick else "peers_cpu_openvino.json"
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / name
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

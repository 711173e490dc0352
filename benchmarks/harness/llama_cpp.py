"""llama.cpp through llama-cpp-python, the peer every CPU figure is held against: its build and its decoding.

No wheel of llama-cpp-python is published for this platform: it is built from PyPI's source distribution on
first use (about 5 minutes on 2 idle cores, much longer on a busy machine) and cached under
`<cache>/wheels/llama_cpp`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from assisted_backends.cache_dir import cache_root

LLAMA_CPP_VERSION = "0.3.36"


def llama_cpp_available() -> bool:
    """Import `llama_cpp`, installing llama-cpp-python first if needed: from the wheel cached under
    <cache>/wheels/llama_cpp, else built from PyPI's source distribution (no wheel for this platform
    is published: about 5 minutes on 2 cores) and cached there. False, with the reason, if that fails."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is not None:
        importlib.import_module("llama_cpp")
        return True
    wheels = cache_root() / "wheels" / "llama_cpp"
    if not list(wheels.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl")):
        print(f"building llama-cpp-python {LLAMA_CPP_VERSION} into {wheels} (once) ...", file=sys.stderr, flush=True)
        build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels)]
        environment = dict(
            os.environ,
            CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF",
            CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1),
        )
        done = subprocess.run([*build, f"llama-cpp-python=={LLAMA_CPP_VERSION}"], env=environment)
        if done.returncode != 0:
            print("llama-cpp-python did not build: llama.cpp columns skipped", file=sys.stderr)
            return False
    wheel = sorted(wheels.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl"))[-1]
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", str(wheel)]).returncode != 0:
        print(f"installing {wheel} failed: llama.cpp columns skipped", file=sys.stderr)
        return False
    importlib.invalidate_caches()
    importlib.import_module("llama_cpp")
    return True


def llama_cpp_decoder(
    path: str | Path, prompt: torch.Tensor, new_tokens: int, threads: int, lookup: int | None = None, n_ctx: int = 2048
) -> Callable[[], list[int]]:
    """() -> exactly `new_tokens` greedy token ids after `prompt` [1, P] from llama.cpp on the file `path` (EOS
    ignored: tokens are read from `Llama.generate` until there are enough); with `lookup`, its prompt-lookup
    speculative decoding (`LlamaPromptLookupDecoding`) of that many tokens."""
    from llama_cpp import Llama

    draft = None
    if lookup:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup)
    llm = Llama(str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False, draft_model=draft)
    ids = prompt[0].tolist()

    def run() -> list[int]:
        llm.reset()
        out: list[int] = []
        for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) == new_tokens:
                break
        return out

    return run

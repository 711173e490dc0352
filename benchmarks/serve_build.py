"""llama-server, built from the llama.cpp that llama-cpp-python's source distribution vendors (the same source,
options and per-CPU cache key as `benchmarks.harness.llama_cpp_tools`, which builds the other tools without it).

    python -m benchmarks.serve_build          # build (once; about 5-10 minutes on 2 cores) and print its path

Cached as `<cache>/llama_cpp_tools/<key>/server/llama-server`; a machine with other instruction-set flags builds
its own copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import llama_cpp_tools as tools

SERVER_OPTIONS = tuple(o for o in tools.CMAKE_OPTIONS if not o.startswith("-DLLAMA_BUILD_SERVER")) + (
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


def server_path() -> Path:
    return tools.tools_dir() / "server" / "llama-server"


def llama_server(build: bool = True, jobs: int | None = None) -> Path:
    """The llama-server binary for this CPU, built on first use (raises `LlamaCppToolsError` when it cannot be)."""
    path = server_path()
    if path.is_file() or not build:
        return path
    with tools._lock(path.parent.parent / ".server.lock"):
        if path.is_file():
            return path
        cmake = shutil.which("cmake")
        if cmake is None or shutil.which("c++") is None and shutil.which("g++") is None:
            raise tools.LlamaCppToolsError("building llama-server needs cmake and a C++ compiler")
        source = tools._source_dir()
        build_dir = path.parent / "build"
        path.parent.mkdir(parents=True, exist_ok=True)
        log = path.parent / "build.log"
        print(f"building llama-server into {path.parent} (once, about 5-10 minutes on 2 cores) ...", file=sys.stderr,
              flush=True)  # fmt: skip
        with open(log, "w") as out:
            configure = [cmake, "-S", str(source), "-B", str(build_dir), *SERVER_OPTIONS]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            steps = [configure, [cmake, "--build", str(build_dir), "--parallel", str(jobs or os.cpu_count() or 1),
                                 "--target", "llama-server"]]  # fmt: skip
            for step in steps:
                if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    raise tools.LlamaCppToolsError(f"building llama-server failed: see the end of {log}")
        built = next(p for p in (build_dir / "bin" / "llama-server", build_dir / "llama-server") if p.is_file())
        shutil.copy2(built, path.with_suffix(".partial"))
        path.with_suffix(".partial").rename(path)
        shutil.rmtree(build_dir, ignore_errors=True)
    return path


if __name__ == "__main__":
    print(llama_server())

"""A build users can trust (`extension.build_library`): a killed build's lock is cleared with a line, a failed
build says the compiler's first error and is remembered, a compiler that cannot build is refused by name.

Each case builds a small library of its own (no torch headers: seconds) in a fresh cache folder.
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap

import pytest

from assisted_backends.native import extension

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not extension.compiler_identity("c++"),
                                reason="needs Linux and a C++ compiler")  # fmt: skip

GCC_OUTPUT = """Error building extension 'broken': [1/2] c++ -MMD -MF broken.o.d -O3 -c /tmp/x/broken.cpp -o broken.o
FAILED: broken.o
c++ -MMD -MF broken.o.d -DTORCH_EXTENSION_NAME=broken -O3 -c /tmp/x/broken.cpp -o broken.o
/tmp/x/broken.cpp: In function 'int f()':
/tmp/x/broken.cpp:3:10: error: 'undeclared' was not declared in this scope
/tmp/x/broken.cpp:4:1: error: expected ';' before '}' token
ninja: build stopped: subcommand failed.
"""


def test_the_first_compiler_error_is_reported_not_the_command_line():
    line = extension.first_compiler_error(GCC_OUTPUT)
    assert line == "broken.cpp:3:10: error: 'undeclared' was not declared in this scope"


def _library(tmp_path, monkeypatch, text: str, name: str) -> extension.Build:
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))
    source = tmp_path / f"{name}.cpp"
    source.write_text(text)
    return extension.Build(name, "test_builds", (source,), flags=("-O1",), ldflags=(), what=f"the test library {name}")


def test_a_failed_build_says_the_first_error_and_is_remembered(tmp_path, monkeypatch):
    build = _library(tmp_path, monkeypatch, "int f() {\n  return undeclared_name;\n}\n", "broken_lib")
    loaded, why = extension.build_library(build)
    assert loaded is None and "error:" in why and "undeclared_name" in why and " -c " not in why
    failed = build.directory() / "failed.txt"
    assert failed.is_file()

    def no_compiling(*args, **kwargs):
        raise AssertionError("a remembered failure must not be rebuilt")

    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", no_compiling)
    loaded, again = extension.build_library(build)
    assert loaded is None and "remembered" in again and "undeclared_name" in again and str(failed) in again
    # a change of the source is a new key: built again (and fails again, with its own first error)
    (tmp_path / "broken_lib.cpp").write_text("int g() { return other_name; }\n")
    assert build.directory() != failed.parent


def test_a_killed_builds_lock_is_cleared_with_a_line(tmp_path, monkeypatch, capsys):
    build = _library(tmp_path, monkeypatch, 'extern "C" int ab_answer() { return 42; }\n', "fine_lib")
    directory = build.directory()
    directory.mkdir(parents=True)
    (directory / "lock").write_text("")  # what torch's FileBaton leaves when its build is killed
    loaded, why = extension.build_library(build)
    assert loaded is True and why == "", why
    assert "left by a build of the test library fine_lib that was killed" in capsys.readouterr().err
    assert not (directory / "lock").exists() and list(directory.glob("fine_lib*.so"))


def test_the_compiler_is_part_of_the_key(monkeypatch, tmp_path):
    before = extension.build_key()
    fake = tmp_path / "g++-other"
    fake.write_text("#!/bin/sh\necho 'g++ (Other) 99.1'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(fake))
    assert extension.build_key() != before


def test_a_clang_without_openmp_is_refused_by_name(tmp_path, monkeypatch):
    fake = tmp_path / "clang++"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Debian clang version 14.0.6'; exit 0; fi\n"
                    "echo \"<stdin>:1:10: fatal error: 'omp.h' file not found\" >&2; exit 1\n")  # fmt: skip
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))
    loaded, why = extension.build_library(extension.KERNELS)
    assert loaded is None
    assert why.startswith(f"{fake} (Debian clang version 14.0.6) has no OpenMP runtime") and "CXX=g++" in why


@pytest.mark.slow  # a full build of the kernels with clang (2-4 minutes on 2 cores)
@pytest.mark.skipif(not extension.compiler_identity("clang++"), reason="no clang++ here")
def test_clang_builds_the_kernels_and_they_give_the_same_bits(tmp_path):
    import subprocess

    if extension._compiler_refusal("clang++"):
        pytest.skip(extension._compiler_refusal("clang++"))  # refused by name: the case above
    script = textwrap.dedent(
        """
        import torch
        from assisted_backends.native import extension
        from assisted_backends.quantized import blocks
        print("STATUS", extension.status().line())
        weight = blocks.from_float(torch.randn(80, 256, generator=torch.Generator().manual_seed(0)), 4)
        x = torch.randn(9, 256, generator=torch.Generator().manual_seed(1))
        for isa in extension.runnable_isas():
            same = torch.equal(weight.matmul(x, extension.ISA_NAMES.index(isa)), blocks.reference_linear(weight, x))
            print("SAME", isa, same)
        """
    )
    env = {**os.environ, "CXX": "clang++", "ASSISTED_BACKENDS_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "the package's block kernels" in lines[0], lines[0]
    same = [line for line in lines if line.startswith("SAME")]
    assert same and all(line.endswith("True") for line in same), same

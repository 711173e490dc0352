"""A build users can trust (`extension.build_library`): a killed build's lock is cleared with a line, a failed
build says the compiler's first error and is remembered (a failure of the moment is retried), a library is loaded
under the lock and only once its build finished, a cache that cannot be written is one line, a compiler that cannot
build is refused by name, and the key names Python's ABI and the sanitizer.

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


def test_python_abi_and_sanitizer_are_part_of_the_key(monkeypatch):
    before = extension.build_key()
    monkeypatch.setattr(extension, "python_tag", lambda: "cpython-399-x86_64-linux-gnu")
    assert extension.build_key() != before
    monkeypatch.undo()
    monkeypatch.setenv(extension.SANITIZE_VARIABLE, "address")
    assert "-fsanitize=address" in extension.KERNELS.compile_flags()
    assert "-fsanitize=address" in extension.KERNELS.link_flags()
    sanitized = extension.KERNELS.directory()
    monkeypatch.delenv(extension.SANITIZE_VARIABLE)
    assert extension.KERNELS.directory() != sanitized
    monkeypatch.setenv(extension.SANITIZE_VARIABLE, "memory")
    with pytest.raises(ValueError, match="ASSISTED_BACKENDS_SANITIZE='memory' is not one of address"):
        extension.sanitizer_flags()


@pytest.mark.parametrize("failure", [
    RuntimeError("Error building extension 'flaky_lib': c++: fatal error: Killed signal terminated program cc1plus"),
    FileNotFoundError(2, "No such file or directory", "ninja"),
    RuntimeError("flaky_lib.cpp:1:1: error: unable to write output: No space left on device"),
])  # fmt: skip
def test_a_failure_of_the_moment_is_retried_not_remembered(tmp_path, monkeypatch, failure):
    build = _library(tmp_path, monkeypatch, 'extern "C" int ab_flaky() { return 7; }\n', "flaky_lib")
    from torch.utils import cpp_extension

    real_load = cpp_extension.load

    def killed(*args, **kwargs):
        raise failure

    monkeypatch.setattr(cpp_extension, "load", killed)
    loaded, why = extension.build_library(build)
    assert loaded is None and "not remembered: the next run tries again" in why, why
    assert not (build.directory() / "failed.txt").exists()
    monkeypatch.setattr(cpp_extension, "load", real_load)
    loaded, why = extension.build_library(build)
    assert loaded is True and why == "", why


def test_a_library_whose_build_did_not_finish_is_built_not_loaded(tmp_path, monkeypatch):
    build = _library(tmp_path, monkeypatch, 'extern "C" int ab_half() { return 3; }\n', "half_lib")
    directory = build.directory()
    directory.mkdir(parents=True)
    (directory / "half_lib.so").write_bytes(b"\x7fELF half-linked")  # a link cut short: loading it would fail
    loaded, why = extension.build_library(build)
    assert loaded is True and why == "", why
    assert (directory / extension.COMPLETE).is_file()


def test_a_library_is_loaded_under_the_build_lock(tmp_path, monkeypatch, capsys):
    import fcntl
    import threading

    build = _library(tmp_path, monkeypatch, 'extern "C" int ab_locked() { return 5; }\n', "locked_lib")
    assert extension.build_library(build) == (True, "")
    results = []
    with open(build.directory() / ".build.flock", "w") as handle:  # another builder holds the key
        fcntl.flock(handle, fcntl.LOCK_EX)
        loader = threading.Thread(target=lambda: results.append(extension.build_library(build)))
        loader.start()
        loader.join(timeout=1.0)
        assert loader.is_alive() and not results, "the library was loaded while another process held the lock"
        fcntl.flock(handle, fcntl.LOCK_UN)
    loader.join(timeout=30)
    assert results == [(True, "")]
    assert "waiting for another process building the test library locked_lib" in capsys.readouterr().err


def test_a_cache_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(blocker / "cache"))  # under a file: no directory can be made
    loaded, why = extension.build_library(extension.KERNELS)
    assert loaded is None
    assert why.startswith(
        f"cannot build the package's kernels: the cache directory {blocker / 'cache'} cannot be written ("
    ) and why.endswith("set ASSISTED_BACKENDS_CACHE to a writable directory"), why


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

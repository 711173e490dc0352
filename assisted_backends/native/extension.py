"""The package's own CPU kernels (`csrc/block_kernels.cpp` and friends): built on first use, cached, registered as
custom ops; and the build machinery any native library of the package uses (`build_library`).

`status()` compiles the C++ sources with torch's `cpp_extension` (ninja and the system compiler) the first
time a process needs them, into `<cache>/kernels/<key>/`, where the key names the sources' and headers' hash, the
flags, the compiler (its path and version line), Python's version and ABI, the torch version and the CPU's
instruction sets; later
processes load the built library in milliseconds. While it compiles, one line on stderr says so (30-130 s on 2
cores). The library registers `torch.ops.assisted_backends.block_linear` and friends; `register_fake` gives
`torch.compile` their shapes so a compiled graph treats them as opaque calls.

A build users can trust (`build_library`, for every library of the package):
- one builder at a time per key (an flock the kernel releases when a builder dies); a builder that holds it and
  finds torch's `lock` file left by a build killed mid-way removes it, with a line saying so (torch's own lock
  would otherwise make every later process wait for ever, silently);
- a library is loaded under the same lock, and only once its build finished (`complete.txt`, written last): a
  second process never loads a half-linked file;
- a failed build reports the compiler's first error line (not its command line); a failure of the sources (a
  compiler diagnostic, an undefined symbol) is remembered in `<key>/failed.txt`: no process retries it until the
  sources, flags, compiler, Python or torch change (the key), or the file is removed. A failure of the moment (a
  compiler killed, a tool missing, a full disk) is not remembered: the next process tries again;
- a cache directory that cannot be written is one line naming it and `ASSISTED_BACKENDS_CACHE`;
- g++ builds; clang++ builds where its OpenMP runtime is installed, else it is refused by name, in one line.

`ASSISTED_BACKENDS_SANITIZE=address` builds every library with AddressSanitizer (its own key; run Python with the
ASan runtime preloaded, as `.ci/lanes/asan.sh` does): an out-of-bounds read or write in the native code is then a
report naming the line, not silent corruption.

When the kernels cannot run (no compiler, no AVX2, a build error, or `ASSISTED_BACKENDS_KERNELS=aten`),
`status()` says why in one sentence and the quantized layers use PyTorch's int4/int8 kernels instead
(`quantized.kernels`): the same tokens as always on that path, slower.

`ASSISTED_BACKENDS_KERNEL_ISA` = `amx` | `avx512vnni` | `avxvnni` | `avx2` | `scalar` forces one path (tests run every
path the machine runs); each path runs only where the CPU reports its own flags (CPUID at run time: AVX-512 VNNI does
not imply AVX-VNNI; AMX also needs the OS's permission), and naming one the CPU lacks is a one-line error. Every
path computes the same bits. `amx` (AMX int8 tiles for passes of 16 rows, `block_amx_min_rows`; the AVX-512 VNNI
tile for fewer) is chosen only when named: on the Xeon measured it paid at 16 rows for Q4_0 / Q4_K and not below.
`amxmodel` runs the AMX path's code on a software model of the tile instructions (slow; it lets a CPU without AMX
test that code bit for bit); it too is never chosen unless named.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from assisted_backends.cache_dir import cache_root

CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "block_kernels.cpp"
SOURCES = (SOURCE, CSRC / "block_tile_avx512.cpp", CSRC / "block_tile_avx2.cpp", CSRC / "block_tile_amx.cpp",
           CSRC / "row_attention.cpp", CSRC / "cache_attention.cpp")  # fmt: skip
#: row_math.h: the arithmetic the kernels share with the native decoder (its build key hashes it too)
HEADERS = (CSRC / "block_layout.h", CSRC / "block_avx512.h", CSRC / "cpu_features.h", CSRC / "tile_pool.h",
           CSRC / "block_tile_avx2.inc", CSRC / "row_math.h", CSRC / "chunk_attention.h")  # fmt: skip
LIBRARY = "assisted_backends_block_kernels"
ISA_NAMES = ("scalar", "avx2", "avxvnni", "avx512vnni", "amx", "amxmodel")  # the C++ enum's order (cpu_features.h)
#: CPUID features as /proc/cpuinfo names them, in the bit order of csrc/cpu_features.h
FEATURES = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8")
#: what each path needs, each checked on its own (AVX-512 VNNI does not imply AVX-VNNI: Zen 4, Cascade Lake)
PATH_NEEDS = {
    "scalar": frozenset(),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "avxvnni": frozenset({"avx2", "fma", "f16c", "avx_vnni"}),
    "avx512vnni": frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}),
    # AMX tiles for passes of several rows (AVX-512 VNNI for the others and for the scales)
    "amx": frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8"}),
    # the AMX path's code on a software model of the tile instructions: for tests, never chosen unless forced
    "amxmodel": frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}),
}
#: the default path: the first one the CPU runs (AMX only when named: on the Xeon measured it did not beat the
#: AVX-512 VNNI tile below 16 rows, benchmarks/RESULTS.md "AMX")
PREFERENCE = ("avx512vnni", "avxvnni", "avx2", "scalar")
ISA_VARIABLE = "ASSISTED_BACKENDS_KERNEL_ISA"
SWITCH_VARIABLE = "ASSISTED_BACKENDS_KERNELS"
SANITIZE_VARIABLE = "ASSISTED_BACKENDS_SANITIZE"
_SANITIZERS = {"address": ("-fsanitize=address", "-fno-omit-frame-pointer")}
COMPLETE = "complete.txt"  # written last by a build that finished: only then is the library loaded
# -fopenmp: at::parallel_for runs serially without it; -ffp-contract=off: no FMA may change an fp32 sum's rounding
_BUILD_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fopenmp"]


@dataclass(frozen=True)
class KernelStatus:
    """Whether the package's kernels run here, on which instruction set, and why not when they don't."""

    available: bool
    isa: str  # the best path this CPU runs ("" when unavailable)
    reason: str  # one sentence for the run's report

    def line(self) -> str:
        if self.available:
            return f"quantized layers: the package's block kernels ({self.isa}, integer dot products, batch-invariant)"
        return f"quantized layers: PyTorch's int4/int8 kernels ({self.reason})"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def paths_for(flags: set[str] | frozenset[str]) -> list[str]:
    """The paths a CPU with these /proc/cpuinfo flags runs, in ISA_NAMES order (each on its own flags)."""
    return [name for name in ISA_NAMES if PATH_NEEDS[name] <= set(flags)]


def best_for(flags: set[str] | frozenset[str]) -> str:
    """The path used when none is forced on a CPU with these flags."""
    runnable = paths_for(flags)
    return next(name for name in PREFERENCE if name in runnable)


def feature_mask(flags: set[str] | frozenset[str]) -> int:
    """The C++ side's feature bits for a set of /proc/cpuinfo flags (to ask it what such a CPU would run)."""
    return sum(1 << bit for bit, name in enumerate(FEATURES) if name in flags)


def _cpu_key() -> str:
    flags = _cpu_flags()
    wanted = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_int8")
    return "-".join(flag for flag in wanted if flag in flags) or "generic"


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


@functools.lru_cache(maxsize=8)
def compiler_identity(compiler: str) -> str:
    """The compiler's resolved path and first `--version` line ('' when it does not run)."""
    path = shutil.which(compiler)
    if path is None:
        return ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        return f"{os.path.realpath(path)} {(done.stdout.splitlines() or [''])[0]}"
    return ""


def sanitizer_flags() -> tuple[str, ...]:
    """The compile and link flags `ASSISTED_BACKENDS_SANITIZE` asks for (none when unset)."""
    raw = os.environ.get(SANITIZE_VARIABLE, "").strip().lower()
    if raw and raw not in _SANITIZERS:
        raise ValueError(f"{SANITIZE_VARIABLE}={raw!r} is not one of {', '.join(_SANITIZERS)} (or unset)")
    return _SANITIZERS.get(raw, ())


def python_tag() -> str:
    """Python's version and ABI as an extension module's file name carries them (e.g. cpython-311-x86_64-linux-gnu)."""
    return sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag or "python"


def build_key(sources: Sequence[Path] = SOURCES, headers: Sequence[Path] = HEADERS,
              flags: Sequence[str] = tuple(_BUILD_FLAGS)) -> str:  # fmt: skip
    """Names a build: the sources' and headers' hash, the flags, the compiler, Python's version and ABI, torch's
    version, the CPU's flags."""
    digest = hashlib.sha256(" ".join(flags).encode() + compiler_identity(_compiler()).encode())
    digest.update(python_tag().encode())
    for path in sorted({*sources, *headers}):
        digest.update(path.name.encode() + path.read_bytes())
    raw = f"{digest.hexdigest()[:12]}-{sys.implementation.cache_tag}-torch{torch.__version__}-{_cpu_key()}"
    return raw.replace("+", "_").replace("/", "_")


def _switched_off() -> bool:
    return os.environ.get(SWITCH_VARIABLE, "").strip().lower() == "aten"


def _why_not_buildable() -> str:
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        return "the package's kernels are built for x86-64 Linux"
    flags = _cpu_flags()
    if not {"avx2", "fma", "f16c"} <= flags:
        return "the CPU lacks AVX2/FMA/F16C"
    return ""


def _compiler_refusal(compiler: str) -> str:
    """'' when `compiler` can build the package's libraries, else one sentence naming it and the fix."""
    identity = compiler_identity(compiler)
    if not identity:
        return f"no C++ compiler ({compiler}) on PATH: install g++ to build the package's kernels"
    if "clang" in identity.lower():
        probe = subprocess.run([shutil.which(compiler), "-fopenmp", "-x", "c++", "-E", "-"], input="#include <omp.h>\n",
                               capture_output=True, text=True)  # fmt: skip
        if probe.returncode != 0:
            return (f"{compiler} ({identity.split(' ', 1)[1]}) has no OpenMP runtime (omp.h): install libomp-dev, "
                    "or build with g++ (CXX=g++)")  # fmt: skip
    return ""


_ERROR_LINE = re.compile(r"(?:^|\s)(?:fatal )?error:|undefined reference|cannot find -l|No such file or directory")
# a diagnostic about the sources themselves (file:line: error, an undefined symbol): the same sources fail again
_SOURCE_FAULT = re.compile(r"\.(?:cpp|h|inc|cc)(?::\d+)+: (?:fatal )?error:|undefined reference")
# signs of a failure of the moment: a compiler killed (OOM, Ctrl-C), out of disk or memory
_TRANSIENT = re.compile(
    r"Killed|killed|signal|terminated|No space left|Cannot allocate memory|out of memory|"
    r"internal compiler error"
)


def remembered_failure(error: BaseException, output: str) -> bool:
    """Whether a failed build is one to remember: the compiler said the sources are wrong, and nothing says the
    compiler was killed. A tool that is missing (OSError), a killed compiler or a full disk is retried next time."""
    if isinstance(error, OSError):
        return False
    return bool(_SOURCE_FAULT.search(output)) and not _TRANSIENT.search(output)


def first_compiler_error(output: str) -> str:
    """The compiler's first error line in a failed build's output (file names without their folders), else the
    output's first line that is not a command line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if _ERROR_LINE.search(line) and not line.startswith(("[", "FAILED:")) and " -c " not in line:
            return re.sub(r"(?:/[^\s:/]+)+/([^\s:/]+):", r"\1:", line)
    commands = ("[", "FAILED:", "c++ ", "g++ ", "clang")
    rest = [line for line in lines if not line.startswith(commands) and " -o " not in line]
    return rest[0] if rest else (lines[0] if lines else "no output")


@dataclass(frozen=True)
class Build:
    """One native library of the package: what `build_library` compiles and where it keeps it."""

    name: str  # the shared object's name (and torch's extension name)
    folder: str  # <cache>/<folder>/<key>/
    sources: tuple[Path, ...]
    headers: tuple[Path, ...] = ()
    flags: tuple[str, ...] = tuple(_BUILD_FLAGS)
    ldflags: tuple[str, ...] = ("-fopenmp",)
    python_module: bool = False  # True: a pybind11 module returned by build_library; False: ops registered
    what: str = "the package's kernels"  # for the lines printed and the reasons given

    def compile_flags(self) -> tuple[str, ...]:
        return self.flags + sanitizer_flags()

    def link_flags(self) -> tuple[str, ...]:
        return self.ldflags + sanitizer_flags()

    def directory(self) -> Path:
        return cache_root() / self.folder / build_key(self.sources, self.headers, self.compile_flags())


def build_library(build: Build):
    """Build (first use) or load `build`'s library: (the module, or True for an ops library; '') when it loads,
    (None, one sentence why not) when it cannot. The rules of the module docstring: one builder at a time, a
    library loaded under the lock once complete, a stale torch lock cleared with a line, a failure of the sources
    remembered with the compiler's first error, one of the moment retried."""
    directory = build.directory()
    with contextlib.ExitStack() as held:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            held.enter_context(_build_lock(directory, build.what))
        except OSError as error:  # a read-only cache: a finished library there still loads (nobody writes it)
            if (directory / COMPLETE).is_file():
                return _load(build, directory), ""
            return None, (f"cannot build {build.what}: the cache directory {cache_root()} cannot be written "
                          f"({error.strerror or error}); set ASSISTED_BACKENDS_CACHE to a writable "
                          "directory")  # fmt: skip
        failed = directory / "failed.txt"
        if failed.is_file():
            return None, (f"{build.what} did not build (remembered; delete {failed} to retry): "
                          f"{failed.read_text().strip()}")  # fmt: skip
        if (directory / COMPLETE).is_file():  # the key names the sources: no cpp_extension, no ninja run
            return _load(build, directory), ""
        refusal = _compiler_refusal(_compiler())
        if refusal:
            return None, refusal
        return _compile(build, directory, failed)


def _load(build: Build, directory: Path):
    """The finished library in `directory`: the module, or True once its ops are registered."""
    library = sorted(directory.glob(f"{build.name}*.so"))[-1]
    if build.python_module:
        return _import_module(build.name, library)
    torch.ops.load_library(str(library))
    return True


def _import_module(name: str, path: Path):
    """The built pybind11 module at `path` (its init function is named `name`), imported as Python imports one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(build: Build, directory: Path, failed: Path):
    from torch.utils import cpp_extension

    fresh = not any(directory.glob(f"{build.name}*.so"))
    started = time.perf_counter()
    if fresh:
        print(f"assisted_backends: building {build.what} once for this CPU and torch {torch.__version__} "
              f"(about a minute; cached in {directory}) ...", file=sys.stderr, flush=True)  # fmt: skip
    try:
        loaded = cpp_extension.load(
            name=build.name,
            sources=[str(path) for path in build.sources],
            extra_cflags=list(build.compile_flags()),
            extra_ldflags=list(build.link_flags()),
            build_directory=str(directory),
            is_python_module=build.python_module,
            verbose=False,
        )
    except Exception as error:
        output = str(error)
        line = first_compiler_error(output)[:300]
        if not remembered_failure(error, output):  # of the moment: the next process tries again
            return None, f"{build.what} did not build (not remembered: the next run tries again): {line}"
        failed.write_text(line + "\n")  # remembered: no process retries until the key changes
        return None, f"{build.what} did not build: {line}"
    (directory / COMPLETE).write_text(f"{build.name} built {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    if fresh:
        print(f"assisted_backends: {build.what} built in {time.perf_counter() - started:.0f} s", file=sys.stderr,
              flush=True)  # fmt: skip
    return (loaded if build.python_module else True), ""


@contextlib.contextmanager
def _build_lock(directory: Path, what: str):
    """Hold `<directory>/.build.flock` (released by the kernel if this process dies). Holding it, a torch
    `lock` file in the directory can only be a killed build's: it is removed, with a line saying so."""
    import fcntl

    with open(directory / ".build.flock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"assisted_backends: waiting for another process building {what} in {directory} ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if stale.exists():
                stale.unlink()
                print(f"assisted_backends: removed {stale}, left by a build of {what} that was killed mid-way",
                      file=sys.stderr, flush=True)  # fmt: skip
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


KERNELS = Build(LIBRARY, "kernels", SOURCES, HEADERS)


def _library() -> Path:
    return KERNELS.directory() / f"{LIBRARY}.so"


def status() -> KernelStatus:
    """Whether layers loaded now use the package's kernels (`ASSISTED_BACKENDS_KERNELS=aten` switches them off)."""
    if _switched_off():
        return KernelStatus(False, "", f"{SWITCH_VARIABLE}=aten")
    return _built()


@functools.lru_cache(maxsize=1)
def _built() -> KernelStatus:
    """Build (first use) and load the kernels; the outcome, once per process."""
    why = _why_not_buildable()
    if why:
        return KernelStatus(False, "", why)
    loaded, why = build_library(KERNELS)
    if not loaded:
        return KernelStatus(False, "", why)
    try:
        _register_fakes()
        best = ISA_NAMES[int(torch.ops.assisted_backends.block_cpu_isa())]
    except Exception as error:  # a library that loads but does not answer leaves the ATen path working
        return KernelStatus(False, "", f"the package's kernels did not load: {str(error).strip()[:200]}")
    if best == "scalar":
        return KernelStatus(False, "", "the CPU lacks AVX2")
    return KernelStatus(True, best, "")


def available() -> bool:
    return status().available


def forced_isa() -> int:
    """The instruction set the kernels use: -1 for the CPU's best, or the one the environment names, which this
    CPU must run (read on every call, so a test can switch it; one dict lookup while it is unchanged). A name
    the package does not know, or a path this CPU lacks, is a one-line ValueError (never an illegal instruction)."""
    raw = os.environ.get(ISA_VARIABLE, "")
    if raw != _forced[0]:
        name = raw.strip().lower()
        if name and name not in ISA_NAMES:
            raise ValueError(f"{ISA_VARIABLE}={raw!r} is not one of {', '.join(ISA_NAMES)} (or unset: the CPU's best)")
        if name and available() and name not in runnable_isas():
            raise ValueError(f"{ISA_VARIABLE}={raw!r}: this CPU does not run the {name} path (it runs "
                             f"{', '.join(runnable_isas())}); name one of these or unset it")  # fmt: skip
        _forced[:] = [raw, ISA_NAMES.index(name) if name else -1]
    return _forced[1]


_forced: list = ["", -1]


def runnable_isas() -> list[str]:
    """Every path this CPU runs (CPUID, each path on its own flags), in ISA_NAMES order (for tests)."""
    if not available():
        return []
    mask = int(torch.ops.assisted_backends.block_cpu_paths(-1))
    return [name for bit, name in enumerate(ISA_NAMES) if mask >> bit & 1]


_FAKES_REGISTERED = False


def _register_fakes() -> None:
    global _FAKES_REGISTERED
    if _FAKES_REGISTERED:
        return

    @torch.library.register_fake("assisted_backends::block_linear")
    def _(x, codes, d, dmin, sc, mn, bias, n, k, bits, group, sb, offset, isa):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("assisted_backends::row_attention")
    def _(q, k, v, mask, lengths, scale, isa):
        return q.new_empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3]))

    @torch.library.register_fake("assisted_backends::cache_attention")
    def _(q, k, v, allowed, start, window, scale, isa):
        return q.new_empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3]))

    @torch.library.register_fake("assisted_backends::block_quantize_activations")
    def _(x):
        m, k = x.shape
        return (
            x.new_empty((m, k), dtype=torch.int8),
            x.new_empty((m, k // 32), dtype=torch.float32),
            x.new_empty((m, k // 32), dtype=torch.float32),
            x.new_empty((m, k // 16), dtype=torch.int32),
        )

    _FAKES_REGISTERED = True

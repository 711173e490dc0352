"""The package's own CPU kernels (`csrc/block_kernels.cpp`): built on first use, cached, registered as custom ops.

`block_ops()` compiles the C++ source with torch's `cpp_extension` (ninja and the system compiler) the first
time a process needs it, into `<cache>/kernels/<key>/`, where the key names the source's hash, the torch
version and the CPU's instruction sets; later processes load the built library in milliseconds. While it
compiles, one line on stderr says so (30-130 s on 2 cores). The library registers
`torch.ops.assisted_backends.block_linear` and friends; `register_fake` gives `torch.compile` their shapes
so a compiled graph treats them as opaque calls.

When the kernels cannot run (no compiler, no AVX2, a build error, or `ASSISTED_BACKENDS_KERNELS=aten`),
`status()` says why in one sentence and the quantized layers use PyTorch's int4/int8 kernels instead
(`quantized.kernels`): the same tokens as always on that path, slower.

`ASSISTED_BACKENDS_KERNEL_ISA` = `avx512vnni` | `avxvnni` | `avx2` | `scalar` forces a narrower path than the
CPU's best (tests run every path the machine can); every path computes the same bits.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from assisted_backends.cache_dir import cache_root

SOURCE = Path(__file__).with_name("csrc") / "block_kernels.cpp"
SOURCES = (SOURCE, SOURCE.with_name("row_attention.cpp"))
ISA_NAMES = ("scalar", "avx2", "avxvnni", "avx512vnni")  # the C++ enum's order (csrc/cpu_features.h)
#: CPUID features as /proc/cpuinfo names them, in the bit order of csrc/cpu_features.h
FEATURES = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8")
#: what each path needs, each checked on its own (AVX-512 VNNI does not imply AVX-VNNI: Zen 4, Cascade Lake)
PATH_NEEDS = {
    "scalar": frozenset(),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "avxvnni": frozenset({"avx2", "fma", "f16c", "avx_vnni"}),
    "avx512vnni": frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}),
}
PREFERENCE = ("avx512vnni", "avxvnni", "avx2", "scalar")  # the default path: the first one the CPU runs
ISA_VARIABLE = "ASSISTED_BACKENDS_KERNEL_ISA"
SWITCH_VARIABLE = "ASSISTED_BACKENDS_KERNELS"
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
    wanted = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")
    return "-".join(flag for flag in wanted if flag in flags) or "generic"


def build_key() -> str:
    """Names a build: the sources' hash, torch's version, the CPU's instruction sets and the flags."""
    digest = hashlib.sha256(" ".join(_BUILD_FLAGS).encode())
    for path in sorted(SOURCE.parent.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    digest = digest.hexdigest()[:12]
    raw = f"{digest}-torch{torch.__version__}-{_cpu_key()}"
    return raw.replace("+", "_").replace("/", "_")


def _switched_off() -> bool:
    return os.environ.get(SWITCH_VARIABLE, "").strip().lower() == "aten"


def _library() -> Path:
    return cache_root() / "kernels" / build_key() / "assisted_backends_block_kernels.so"


def _why_not_buildable() -> str:
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        return "the package's kernels are built for x86-64 Linux"
    flags = _cpu_flags()
    if not {"avx2", "fma", "f16c"} <= flags:
        return "the CPU lacks AVX2/FMA/F16C"
    if _library().is_file():
        return ""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) on PATH: install g++ to build the package's kernels"
    return ""


def _build() -> None:
    from torch.utils import cpp_extension

    library = _library()
    directory = library.parent
    directory.mkdir(parents=True, exist_ok=True)
    if library.is_file():
        torch.ops.load_library(str(library))
        return
    started = time.perf_counter()
    print(
        f"assisted_backends: building the CPU kernels once for this CPU and torch {torch.__version__} "
        f"(about a minute; cached in {directory}) ...",
        file=sys.stderr,
        flush=True,
    )
    cpp_extension.load(
        name="assisted_backends_block_kernels",
        sources=[str(path) for path in SOURCES],
        extra_cflags=_BUILD_FLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(directory),
        is_python_module=False,
        verbose=False,
    )
    print(f"assisted_backends: CPU kernels built in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


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
    try:
        _build()
        _register_fakes()
        best = ISA_NAMES[int(torch.ops.assisted_backends.block_cpu_isa())]
    except Exception as error:  # a failed build must leave the ATen path working, with the reason reported
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return KernelStatus(False, "", f"the package's kernels did not build: {first[:200]}")
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

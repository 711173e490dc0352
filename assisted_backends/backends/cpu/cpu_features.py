"""Which matrix instructions this CPU has, and the precision that follows from them.

Detection reads the kernel's flag list in /proc/cpuinfo (on Linux, the flags the kernel lets user
space use: AMX appears only when the kernel enables its tile state), falling back to the flag table
of PyTorch's bundled cpuinfo library elsewhere. It has no side effects and imports no vendor library;
tests fake it by pointing `CPUINFO_PATH` at a file of their own or by passing `flags=` directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

CPUINFO_PATH = "/proc/cpuinfo"
CPUINFO_ENV = "ASSISTED_BACKENDS_CPUINFO"  # a file read instead of CPUINFO_PATH (tests fake a CPU with it)

# Flags that decide precision, in the kernel's spelling (torch's cpuinfo table spells them alike).
AMX_BF16 = "amx_bf16"
AMX_INT8 = "amx_int8"
AMX_FP16 = "amx_fp16"
AVX512_BF16 = "avx512_bf16"
AVX512_FP16 = "avx512_fp16"
AVX512_VNNI = "avx512_vnni"
AVX512F = "avx512f"
REPORTED = (AMX_BF16, AMX_INT8, AMX_FP16, AVX512_BF16, AVX512_FP16, AVX512_VNNI, AVX512F)


@dataclass(frozen=True)
class CPUFeatures:
    """The CPU's name, the flags that matter here, and where they were read from."""

    flags: frozenset[str]
    model_name: str = "unknown"
    source: str = "given"
    _reported: tuple[str, ...] = field(default=REPORTED, repr=False)

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run on dedicated instructions (AMX tiles or AVX512-BF16 dot products)."""
        return self.has(AMX_BF16) or self.has(AVX512_BF16)

    @property
    def native_fp16(self) -> bool:
        return self.has(AMX_FP16) or self.has(AVX512_FP16)

    def bf16_support(self) -> str:
        """A phrase naming the instructions bf16 runs on, or '' when it would be emulated."""
        if self.has(AMX_BF16):
            return "AMX-BF16 tiles (oneDNN runs bf16 matmuls on AMX)"
        if self.has(AVX512_BF16):
            return "AVX512-BF16 (oneDNN runs bf16 dot products natively; no AMX on this CPU)"
        return ""

    def summary(self) -> str:
        present = [flag for flag in self._reported if flag in self.flags]
        return f"{self.model_name} [{' '.join(present) or 'no AVX-512/AMX'}] (flags from {self.source})"


def _read_proc_cpuinfo(path: str) -> tuple[frozenset[str], str] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    flags: frozenset[str] = frozenset()
    model_name = "unknown"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = frozenset(value.split())
        elif key == "model name" and model_name == "unknown":
            model_name = value.strip()
    return (flags, model_name) if flags else None


def _torch_cpuinfo() -> tuple[frozenset[str], str] | None:
    """PyTorch's bundled cpuinfo: a dict in torch >= 2.9, `_is_<flag>_supported()` helpers before."""
    cpu = getattr(torch._C, "_cpu", None)
    getter = getattr(cpu, "_get_cpu_capability", None)
    table = getter() if getter is not None else None
    if isinstance(table, dict):
        flags = {name for name, value in table.items() if value is True}
        if "avx512_f" in flags:
            flags.add(AVX512F)
        return frozenset(flags), str(table.get("cpu_name", "unknown"))
    helpers = {
        AMX_BF16: "_is_amx_tile_supported",  # torch 2.8 has no separate amx_bf16 query
        AMX_INT8: "_is_amx_tile_supported",
        AMX_FP16: "_is_amx_fp16_supported",
        AVX512_BF16: "_is_avx512_bf16_supported",
        AVX512_VNNI: "_is_avx512_vnni_supported",
        AVX512F: "_is_avx512_supported",
    }
    if cpu is None or not any(hasattr(cpu, helper) for helper in helpers.values()):
        return None
    flags = {flag for flag, helper in helpers.items() if hasattr(cpu, helper) and getattr(cpu, helper)()}
    return frozenset(flags), "unknown"


def detect(cpuinfo_path: str | None = None) -> CPUFeatures:
    """The features of the CPU this process runs on (reads a file; changes nothing)."""
    path = cpuinfo_path or os.environ.get(CPUINFO_ENV) or CPUINFO_PATH
    found = _read_proc_cpuinfo(path)
    if found is not None:
        return CPUFeatures(flags=found[0], model_name=found[1], source=path)
    found = _torch_cpuinfo()
    if found is not None:
        return CPUFeatures(flags=found[0], model_name=found[1], source="torch cpuinfo")
    return CPUFeatures(flags=frozenset(), model_name="unknown", source="nothing readable")

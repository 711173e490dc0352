"""What this machine offers, found without importing torch: device nodes and tools for `--device`, the
CPU's flags for `--dtype`, and whether the Hub's host resolves.

Each probe is cheap (a file read, a directory listing, one DNS lookup with a deadline), so the CLI can
refuse a flag that cannot work before torch and the models load.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from assisted_backends.extras import install_hint

CPUINFO_PATH = "/proc/cpuinfo"
CPUINFO_ENV = "ASSISTED_BACKENDS_CPUINFO"  # the CPU backend reads the same override (cpu_features.detect)
HUB_ENDPOINT = "https://huggingface.co"
DNS_DEADLINE_S = 1.5
# dtype -> (the flags that run it natively, their names in words); backends/cpu/precision.py has the same rule
NATIVE_FLAGS = {
    "bf16": (("amx_bf16", "avx512_bf16"), "AMX-BF16 nor AVX512-BF16"),
    "fp16": (("amx_fp16", "avx512_fp16"), "AMX-FP16 nor AVX512-FP16"),
}


def torch_build() -> dict[str, str | None]:
    """`torch.version`'s `__version__`, `cuda` and `hip`, read from its source file ({} when not found)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    try:
        text = (Path(spec.submodule_search_locations[0]) / "version.py").read_text(encoding="utf-8")
    except OSError:
        return {}
    found: dict[str, str | None] = {}
    for key in ("__version__", "cuda", "hip"):
        matched = re.search(rf"^{key}\b[^=\n]*=\s*(.+)$", text, flags=re.MULTILINE)
        if matched is not None:
            value = matched.group(1).strip().strip("'\"")
            found[key] = None if value == "None" else value
    return found


def nvidia_gpu_visible(dev: Path = Path("/dev")) -> bool:
    """An NVIDIA device node (/dev/nvidia0, ...) or the driver's nvidia-smi is present."""
    return any(dev.glob("nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def cuda_problem(dev: Path = Path("/dev")) -> str | None:
    """Why `--device cuda` cannot work here, or None when it may."""
    build = torch_build()
    if build.get("hip"):
        return None  # ROCm builds serve "cuda" through /dev/kfd: leave it to torch
    if build and build.get("cuda") is None:
        return f"this torch ({build.get('__version__', '?')}) is a CPU-only build; install a CUDA build of torch"
    if not nvidia_gpu_visible(dev):
        return "no NVIDIA GPU is visible (no /dev/nvidia* device node, no nvidia-smi); check the driver"
    return None


def hpu_problem() -> str | None:
    """Why `--device hpu` cannot work here, or None when it may."""
    if importlib.util.find_spec("habana_frameworks") is None:
        return f"habana_frameworks is not installed: {install_hint('gaudi')} on a Gaudi host"
    return None


def device_problem(device: str) -> str | None:
    """Why `--device DEVICE` cannot work here (cuda and hpu are probed; other devices are left to their
    backends), or None."""
    return {"cuda": cuda_problem, "hpu": hpu_problem}.get(device, lambda: None)()


def runs_on_cpu(device: str) -> bool:
    """`--device cpu`, or `auto` where no accelerator is found by the probes above."""
    if device == "cpu":
        return True
    return device == "auto" and cuda_problem() is not None and hpu_problem() is not None


def cpu_flags(path: str | None = None) -> tuple[frozenset[str], str]:
    """(the CPU's flags, its model name) from /proc/cpuinfo (or $ASSISTED_BACKENDS_CPUINFO); empty when unreadable."""
    path = path or os.environ.get(CPUINFO_ENV) or CPUINFO_PATH
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset(), "unknown"
    flags: frozenset[str] = frozenset()
    name = "unknown"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and not flags:
            flags = frozenset(value.split())
        elif key.strip() == "model name" and name == "unknown":
            name = value.strip()
    return flags, name


def dtype_problem(dtype: str | None, flag: str) -> str | None:
    """Why `flag dtype` would be emulated (slow) on this CPU, or None (unknown flags: None)."""
    if dtype not in NATIVE_FLAGS:
        return None
    flags, name = cpu_flags()
    needed, words = NATIVE_FLAGS[dtype]
    if not flags or any(f in flags for f in needed):
        return None
    fallback = "bf16" if dtype == "fp16" and any(f in flags for f in NATIVE_FLAGS["bf16"][0]) else "fp32"
    return (
        f"{flag} {dtype}: this CPU ({name}) has neither {words}, so {dtype} would be emulated and slower than "
        f"fp32; pass {flag} {fallback}"
    )


def hub_host() -> str:
    """The host `huggingface_hub` would contact ($HF_ENDPOINT, else huggingface.co)."""
    return urlparse(os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).hostname or "huggingface.co"


def resolves(host: str, deadline_s: float = DNS_DEADLINE_S) -> bool:
    """Whether `host` resolves within the deadline (a lookup still running after it counts as no)."""
    answer: list[bool] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, 443)
            answer.append(True)
        except OSError:
            answer.append(False)

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(deadline_s)
    return bool(answer and answer[0])

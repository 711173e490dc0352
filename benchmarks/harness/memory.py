"""The memory read bandwidth of one thread, and the floor it puts under a decode step (weight bytes / bandwidth)."""

from __future__ import annotations

import resource
import time

import torch


def read_bandwidth_gbs(gib: float = 1.0, repeats: int = 3) -> float:
    """GB/s of `tensor.sum()` over `gib` GiB of fp32, best of `repeats` (after one untimed pass)."""
    data = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    data.sum()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - began)
    return data.numel() * 4 / best / 1e9


def tensor_bytes(modules: list[torch.nn.Module]) -> int:
    """Bytes of the parameters and buffers of `modules`, each tensor counted once (a tied head once)."""
    seen, total = set(), 0
    for module in modules:
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if tensor is not None and tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                total += tensor.nbytes
    return total


def peak_rss_kib() -> int:
    """This process's peak resident memory since its exec, in KiB: /proc/self/status's VmHWM. (`getrusage`'s
    ru_maxrss is no use in a child: Linux carries the forking parent's peak over its exec, so every child
    reported its parent's peak; measured: 1920 MiB against 384 MiB in a child of a 2 GB parent.)"""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

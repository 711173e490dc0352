"""The threads and CPU placement this process actually got (after numactl, taskset or torch's launcher),
and the thread count it should use.

`usable_cores()` = the CPUs in this process's affinity mask, capped by a cgroup CPU quota (a
container's `--cpus`), divided among the ranks a launcher started on this host (LOCAL_WORLD_SIZE).
`set_threads(n)` sets torch's intra-op pool (default: `usable_cores()`); `busy_note()` says when the
machine's load average already fills its CPUs (then more threads mostly wait for each other).

Nothing here changes the placement: `numactl -C/-m`, `taskset -c` and
`python -m torch.backends.xeon.run_cpu` set it before Python starts, and OMP_NUM_THREADS sets torch's
intra-op pool. This module reads the result and warns (never fails) when torch runs more threads than
the cores the process may use, the classic oversubscription that makes a pinned run slower.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch

ALLOCATORS = ("jemalloc", "tcmalloc")


class ThreadOversubscriptionWarning(RuntimeWarning):
    """torch uses more intra-op threads than the CPUs this process is pinned to."""


def _compact(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5, 7, 8) -> '0-2,5,7-8' (the notation numactl and taskset take)."""
    parts: list[str] = []
    start = previous = None
    for cpu in cpus:
        if start is None:
            start = previous = cpu
        elif cpu == previous + 1:
            previous = cpu
        else:
            parts.append(f"{start}-{previous}" if previous != start else str(start))
            start = previous = cpu
    if start is not None:
        parts.append(f"{start}-{previous}" if previous != start else str(start))
    return ",".join(parts)


def _mems_allowed(status_path: str = "/proc/self/status") -> str | None:
    """The NUMA nodes this process may allocate on (numactl -m / --membind narrows it)."""
    try:
        with open(status_path, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Mems_allowed_list:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class ThreadPlacement:
    torch_threads: int
    interop_threads: int
    affinity: tuple[int, ...]  # CPUs this process may run on
    numa_memory_nodes: str | None
    omp_num_threads: str | None
    preloaded_allocator: str | None

    @property
    def oversubscribed(self) -> bool:
        return bool(self.affinity) and self.torch_threads > len(self.affinity)

    def warning(self) -> str | None:
        if not self.oversubscribed:
            return None
        return (
            f"torch uses {self.torch_threads} threads but this process is pinned to {len(self.affinity)} CPU(s) "
            f"({_compact(self.affinity)}): threads will share cores and run slower. Set OMP_NUM_THREADS="
            f"{len(self.affinity)} (or pass as many cores to numactl -C / taskset -c as threads)"
        )

    def as_dict(self) -> dict[str, str]:
        report = {
            "torch_threads": str(self.torch_threads),
            "interop_threads": str(self.interop_threads),
            "cpu_affinity": _compact(self.affinity),
            "cpu_count_pinned": str(len(self.affinity)),
            "numa_memory_nodes": self.numa_memory_nodes or "unknown",
            "omp_num_threads": self.omp_num_threads or "unset",
            "preloaded_allocator": self.preloaded_allocator or "none",
        }
        warning = self.warning()
        if warning:
            report["thread_warning"] = warning
        return report


def placement() -> ThreadPlacement:
    """Read the current placement (no side effects)."""
    try:
        cpus = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        cpus = tuple(range(os.cpu_count() or 1))
    preload = os.environ.get("LD_PRELOAD", "")
    allocator = next((name for name in ALLOCATORS if name in preload), None)
    return ThreadPlacement(
        torch_threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        affinity=cpus,
        numa_memory_nodes=_mems_allowed(),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        preloaded_allocator=allocator,
    )


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs allowed by the cgroup quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`); None if unlimited."""
    try:
        quota, period = open(f"{root}/cpu.max", encoding="utf-8").read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(open(f"{root}/cpu/cpu.cfs_quota_us", encoding="utf-8").read())
        period = int(open(f"{root}/cpu/cpu.cfs_period_us", encoding="utf-8").read())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def _affinity_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cores(cgroup_root: str = "/sys/fs/cgroup", environ: dict | None = None) -> int:
    """Cores this process may keep busy: affinity, capped by the cgroup quota, shared among local ranks."""
    environ = os.environ if environ is None else environ
    cores = float(_affinity_count())
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, quota)
    try:
        ranks = max(1, int(environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, int(cores // ranks))


def set_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads (default `usable_cores()`); return the count now in use."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads}")
    torch.set_num_threads(threads or usable_cores())
    return torch.get_num_threads()


def busy_note(load: float | None = None, cpus: int | None = None, threads: int | None = None) -> str | None:
    """A note when the 1-minute load average (other jobs) fills the machine's CPUs; None otherwise."""
    try:
        load = os.getloadavg()[0] if load is None else load
    except (AttributeError, OSError):
        return None
    cpus = cpus or os.cpu_count() or 1
    if load < cpus:
        return None
    advice = "" if threads == 1 else ", and fewer threads are often faster here (try --threads 1)"
    return f"this machine looks busy (load average {load:.1f} on {cpus} CPU(s)): timings will be slow and noisy{advice}"


def warn_if_oversubscribed(current: ThreadPlacement | None = None) -> ThreadPlacement:
    """Warn (ThreadOversubscriptionWarning) when threads exceed the pinned CPUs; return the placement."""
    current = current or placement()
    message = current.warning()
    if message:
        warnings.warn(message, ThreadOversubscriptionWarning, stacklevel=3)
    return current


if __name__ == "__main__":  # `python -m assisted_backends.backends.cpu.affinity`: print the placement as JSON
    import json

    print(json.dumps(warn_if_oversubscribed().as_dict(), indent=2))

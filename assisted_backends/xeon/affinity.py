"""The threads and CPU placement this process actually got (after numactl, taskset or torch's launcher).

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


def warn_if_oversubscribed(current: ThreadPlacement | None = None) -> ThreadPlacement:
    """Warn (ThreadOversubscriptionWarning) when threads exceed the pinned CPUs; return the placement."""
    current = current or placement()
    message = current.warning()
    if message:
        warnings.warn(message, ThreadOversubscriptionWarning, stacklevel=3)
    return current


if __name__ == "__main__":  # `python -m assisted_backends.xeon.affinity`: print the placement as JSON
    import json

    print(json.dumps(warn_if_oversubscribed().as_dict(), indent=2))

"""The threads and CPU placement this process actually got (after numactl, taskset or torch's launcher),
and the thread count it should use.

`usable_cores()` = the CPUs in this process's affinity mask, capped by a cgroup CPU quota (a
container's `--cpus`), divided among the ranks a launcher started on this host (LOCAL_WORLD_SIZE).
`set_threads(n)` sets torch's intra-op pool (default: `usable_cores()`); `busy_note()` says when the
machine's load average already fills its CPUs (then more threads mostly wait for each other).
`probe_threads(step)` times a few calls of `step` (a decode step) at 1 and at N threads, alternating, and
picks the faster: on a machine where another process keeps a core busy, N OpenMP threads wait for the
descheduled one at every barrier and one thread is often several times faster. `CpuMeter` measures,
over a stretch of work, this process's CPU time per wall second and the CPUs other processes used
(/proc/stat): the contention a timing ran under.

Nothing here changes the placement: `numactl -C/-m`, `taskset -c` and
`python -m torch.backends.xeon.run_cpu` set it before Python starts, and OMP_NUM_THREADS sets torch's
intra-op pool. This module reads the result and warns (never fails) when torch runs more threads than
the cores the process may use, the classic oversubscription that makes a pinned run slower.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
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


def warn_if_oversubscribed(current: ThreadPlacement | None = None, stacklevel: int = 3) -> ThreadPlacement:
    """Warn (ThreadOversubscriptionWarning) when threads exceed the pinned CPUs; return the placement."""
    current = current or placement()
    message = current.warning()
    if message:
        warnings.warn(message, ThreadOversubscriptionWarning, stacklevel=stacklevel)
    return current


@functools.cache
def warn_once_if_oversubscribed(torch_threads: int) -> None:
    """`warn_if_oversubscribed()` once per process for each thread count torch runs with (the CPUs a process may
    use are set before it starts: numactl, taskset)."""
    warn_if_oversubscribed(stacklevel=4)


PROC_STAT = "/proc/stat"
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest time is inside user)
FASTER_MARGIN = 0.9  # more threads must take at most 90% of one thread's step time to be chosen


def _busy_cpu_seconds(path: str = PROC_STAT) -> float | None:
    """Seconds all CPUs spent busy since boot (steal included: a hypervisor's other guests), or None."""
    try:
        with open(path, encoding="utf-8") as handle:
            fields = handle.readline().split()[1:]
        return sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class CpuUse:
    """A stretch of work: wall seconds, this process's CPU seconds per wall second, and the CPUs other
    processes kept busy meanwhile (None where /proc/stat cannot be read; 10 ms resolution)."""

    wall_s: float
    own_cpus: float
    others_cpus: float | None

    @staticmethod
    def combine(uses: Sequence[CpuUse]) -> CpuUse:
        """The uses of consecutive stretches as one (weighted by wall time)."""
        wall = sum(use.wall_s for use in uses) or 1e-9
        own = sum(use.own_cpus * use.wall_s for use in uses) / wall
        others = None if any(use.others_cpus is None for use in uses) else sum(
            use.others_cpus * use.wall_s for use in uses) / wall  # fmt: skip
        return CpuUse(wall, own, others)


class CpuMeter:
    """`with CpuMeter() as meter: work()` then `meter.use`: the `CpuUse` of the work."""

    def __enter__(self) -> CpuMeter:
        self._wall, self._own, self._busy = time.perf_counter(), time.process_time(), _busy_cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(time.perf_counter() - self._wall, 1e-9)
        own = time.process_time() - self._own
        busy = _busy_cpu_seconds()
        others = None if busy is None or self._busy is None else max(0.0, (busy - self._busy - own) / wall)
        self.use = CpuUse(wall, own / wall, others)


@dataclass(frozen=True)
class ThreadProbe:
    """What `probe_threads` measured: median ms per step at each thread count, and the CPU use at each."""

    step_ms: dict[int, float]
    use: dict[int, CpuUse]
    chosen: int

    def reason(self) -> str:
        """One line: the chosen count and the measurements behind it."""
        others = CpuUse.combine(list(self.use.values())).others_cpus
        timings = ", ".join(
            f"{ms:.1f} ms at {n} thread{'s' if n > 1 else ''}" for n, ms in sorted(self.step_ms.items())
        )
        busy = "" if others is None else f"; other processes used {others:.1f} CPUs meanwhile"
        return f"a target step took {timings}{busy}"


def probe_threads(
    step: Callable[[], object], counts: Sequence[int], rounds: int = 6, steps: int = 2, budget_s: float = 3.0
) -> ThreadProbe:
    """Time `step` at each thread count in `counts` (alternating order, one untimed call after each switch,
    `steps` timed calls per count and round: short windows, so that a neighbour's burst hits every count
    alike; fewer rounds when `budget_s` runs out), set torch's threads to the fastest count and return the
    measurements. A count's time is the median over rounds of its window's mean step time (stalls at
    barriers are the cost being measured; one window hit by a burst is not). A larger count must beat a
    smaller one by 10%."""
    windows: dict[int, list[float]] = {n: [] for n in counts}  # mean seconds per step of each timed window
    uses: dict[int, list[CpuUse]] = {n: [] for n in counts}
    started = time.perf_counter()
    for round_index in range(rounds):
        for n in counts if round_index % 2 == 0 else list(reversed(counts)):
            torch.set_num_threads(n)
            step()
            with CpuMeter() as meter:
                for _ in range(steps):
                    step()
            windows[n].append(meter.use.wall_s / steps)  # stalls inside a window count: they are the cost
            uses[n].append(meter.use)
        if time.perf_counter() - started > budget_s:
            break
    step_ms = {n: 1000 * statistics.median(values) for n, values in windows.items()}  # one bad window does not
    chosen = min(counts)
    for n in sorted(counts):
        if step_ms[n] < FASTER_MARGIN * step_ms[chosen]:
            chosen = n
    torch.set_num_threads(chosen)
    return ThreadProbe(step_ms, {n: CpuUse.combine(u) for n, u in uses.items()}, chosen)


if __name__ == "__main__":  # `python -m assisted_backends.backends.cpu.affinity`: print the placement as JSON
    import json

    print(json.dumps(warn_if_oversubscribed().as_dict(), indent=2))

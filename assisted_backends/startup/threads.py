"""How many CPU threads a run uses, decided from a measurement of the machine as it is now.

Order: `--threads` > `$OMP_NUM_THREADS` > a probe. The probe (CPU device, more than one usable core, no
multi-rank launch) times a few decode steps of the loaded target at 1 thread and at all usable cores,
alternating, and keeps the faster (more threads must be 10% faster); the benchmark probes again between
cases. The measurement itself is the Python API's (`api.threads`), and the CLI's choice is adopted there, so
its `generate` calls do not probe again. `--threads` above the usable cores is lowered to them, with one
warning. `set_wait_policy` (called before torch is imported) makes idle OpenMP threads sleep instead of
spinning, so that a thread descheduled by a busy neighbour does not stall every barrier of a step
(docs/cli.md, "Threads", has the measurements).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from assisted_backends.api.threads import ThreadChoice

WAIT_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def set_wait_policy(environ: dict | None = None) -> str:
    """OMP_WAIT_POLICY=PASSIVE unless the user chose a wait policy; must run before torch loads OpenMP.
    Returns what the run uses, for its report."""
    environ = os.environ if environ is None else environ
    chosen = [f"{name}={environ[name]}" for name in WAIT_POLICY_VARIABLES if environ.get(name)]
    if chosen:
        return ", ".join(chosen) + " (yours)"
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "OMP_WAIT_POLICY=PASSIVE (idle threads sleep; set OMP_WAIT_POLICY=ACTIVE to spin)"


def initial_choice(args: argparse.Namespace) -> ThreadChoice:
    """Set torch's threads before the models load: the flag, the environment, or every usable core (a probe
    may lower it once the target is loaded)."""
    import torch

    from assisted_backends.api.threads import ThreadChoice, capped
    from assisted_backends.backends.cpu import affinity

    if args.threads is not None:
        count, warning = capped(args.threads, "--threads")
        if warning is not None:
            print(f"warning: {warning}", file=sys.stderr)
        how = "asked for" if warning is None else f"asked for {args.threads}, capped at the usable cores"
        return ThreadChoice(affinity.set_threads(count), "--threads", how)
    if os.environ.get("OMP_NUM_THREADS"):
        return ThreadChoice(torch.get_num_threads(), "OMP_NUM_THREADS", "from the environment")
    threads = affinity.set_threads(None)
    quota = affinity.cgroup_cpu_quota()
    reason = (
        f"usable cores: affinity {len(affinity.placement().affinity)}, cgroup quota "
        f"{'none' if quota is None else f'{quota:g}'}, local ranks {os.environ.get('LOCAL_WORLD_SIZE', '1')}"
    )
    return ThreadChoice(threads, "usable cores", reason)


def probe_applies(choice: ThreadChoice, device_type: str, launched: bool, cores: int) -> bool:
    """Probe only what nobody fixed: more than one usable core, on a CPU, outside multi-rank launches."""
    return choice.source in ("usable cores", "probe") and device_type == "cpu" and not launched and cores > 1


def __getattr__(name: str):
    """The measurement's names (`ThreadChoice`, `decode_step`, `probe`) live in `api.threads`; loaded on use, so
    that importing this module does not import torch."""
    if name in ("ThreadChoice", "decode_step", "probe"):
        from assisted_backends.api import threads

        return getattr(threads, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

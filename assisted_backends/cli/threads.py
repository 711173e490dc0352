"""How many CPU threads a run uses, decided from a measurement of the machine as it is now.

Order: `--threads` > `$OMP_NUM_THREADS` > a probe. The probe (CPU device, more than one usable core, no
multi-rank launch) times a few decode steps of the loaded target at 1 thread and at all usable cores,
alternating, and keeps the faster (more threads must be 10% faster); the benchmark probes again between
cases. `set_wait_policy` (called before torch is imported) makes idle OpenMP threads sleep instead of
spinning, so that a thread descheduled by a busy neighbour does not stall every barrier of a step
(docs/cli.md, "Threads", has the measurements).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

WAIT_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
PROBE_PROMPT_TOKENS = 16


def set_wait_policy(environ: dict | None = None) -> str:
    """OMP_WAIT_POLICY=PASSIVE unless the user chose a wait policy; must run before torch loads OpenMP.
    Returns what the run uses, for its report."""
    environ = os.environ if environ is None else environ
    chosen = [f"{name}={environ[name]}" for name in WAIT_POLICY_VARIABLES if environ.get(name)]
    if chosen:
        return ", ".join(chosen) + " (yours)"
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "OMP_WAIT_POLICY=PASSIVE (idle threads sleep; set OMP_WAIT_POLICY=ACTIVE to spin)"


@dataclass
class ThreadChoice:
    """The thread count in use, where it came from (`--threads`, `OMP_NUM_THREADS`, `probe`, `usable cores`),
    and one line saying why."""

    threads: int
    source: str
    reason: str

    def report(self) -> dict[str, str]:
        return {"threads": str(self.threads), "threads_from": self.source, "threads_reason": self.reason}


def initial_choice(args: argparse.Namespace) -> ThreadChoice:
    """Set torch's threads before the models load: the flag, the environment, or every usable core (a probe
    may lower it once the target is loaded)."""
    import torch

    from assisted_backends.backends.cpu import affinity

    if args.threads is not None:
        return ThreadChoice(affinity.set_threads(args.threads), "--threads", "asked for")
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


def decode_step(model, device) -> Callable[[], None]:
    """One decode step of `model` on top of a short prompt's KV cache (the cache grows by one per call)."""
    import torch

    from assisted_backends import hf_compat

    prompt = torch.zeros((1, PROBE_PROMPT_TOKENS), dtype=torch.long, device=device)
    with torch.inference_mode():
        cache = hf_compat.returned_cache(model(prompt, use_cache=True))
    state = {"cache": cache}
    token = prompt[:, :1]

    def step() -> None:
        with torch.inference_mode():
            output = model(token, use_cache=True, **hf_compat.cache_kwargs(model, state["cache"]))
        state["cache"] = hf_compat.returned_cache(output)

    return step


def probe(choice: ThreadChoice, model, device, cores: int) -> ThreadChoice:
    """Measure 1 against `cores` threads on `model` and return the faster as a `probe` choice (torch set).
    A model the probe cannot step (an unusual forward signature) keeps `choice`, and the reason says why."""
    from assisted_backends.backends.cpu import affinity

    try:
        result = affinity.probe_threads(decode_step(model, device), sorted({1, cores}))
    except Exception as error:  # noqa: BLE001 - a measurement must not end the run; the report names the error
        affinity.set_threads(choice.threads)
        return ThreadChoice(choice.threads, choice.source, f"{choice.reason}; the probe failed: {error!r:.120}")
    return ThreadChoice(result.chosen, "probe", result.reason())

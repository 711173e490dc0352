"""How many CPU threads a call runs with: measured once per process, as the command line measures it.

On a shared CPU torch's default (every core) can be many times slower than one thread: a neighbour that keeps
a core busy makes the other threads wait for it at every barrier. So the first CPU call of `generate` (or of an
`AssistedGenerator`) times a few decode steps of its target at 1 thread and at every usable core, alternating,
keeps the faster (more threads must be 10% faster) and caches the answer for the process. Order:
`threads=` of the call > `set_threads(n)` > `$OMP_NUM_THREADS` > a `torch.set_num_threads` the caller made >
the probe. No probe runs off the CPU, under a multi-rank launch, or with one usable core.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from assisted_backends.backends.cpu import affinity

PROBE_PROMPT_TOKENS = 16


@dataclass
class ThreadChoice:
    """The thread count in use, where it came from (`--threads`, `OMP_NUM_THREADS`, `probe`, `usable cores`,
    `set_threads`, ...), and one line saying why."""

    threads: int
    source: str
    reason: str

    def report(self) -> dict[str, str]:
        return {"threads": str(self.threads), "threads_from": self.source, "threads_reason": self.reason}


_IMPORT_THREADS = torch.get_num_threads()  # torch's count when the package loaded: a change is the caller's
_chosen: ThreadChoice | None = None  # this process's decision, once made
_applied: int | None = None  # the count this module last set: torch's count differing from it is the caller's
# torch's count at which a call without `threads=` has nothing to do: `for_call` left it so, and nothing here
# changed since (None: ask `for_call`). Callers compare it with torch.get_num_threads() and skip the call.
settled: int | None = None


def capped(threads: int, what: str = "threads") -> tuple[int, str | None]:
    """`threads` at most the usable cores, and a warning line when it was lowered (None otherwise)."""
    if threads < 1:
        raise ValueError(f"{what} must be a positive integer, got {threads}; pass 1 or more")
    cores = affinity.usable_cores()
    if threads <= cores:
        return threads, None
    return cores, f"{what} {threads} is more than the {cores} core(s) this process may use; using {cores}"


def _apply(count: int) -> int:
    global _applied, settled
    _applied, settled = affinity.set_threads(count), None
    return _applied


def set_threads(threads: int | None = None) -> int:
    """Fix this process's CPU thread count for every later call (None: every usable core); no probe runs after
    it. More than the usable cores is lowered to them (one warning). Returns the count now in use."""
    global _chosen
    count, warning = capped(threads if threads is not None else affinity.usable_cores())
    if warning is not None:
        print(f"assisted_backends: warning: {warning}", file=sys.stderr)
    _chosen = ThreadChoice(_apply(count), "set_threads", "asked for")
    return _chosen.threads


def adopt(choice: ThreadChoice) -> None:
    """Record a count a front end chose itself (the command line's probe), so that calls do not probe again."""
    global _chosen, _applied, settled
    _chosen, _applied, settled = choice, choice.threads, None


def forget() -> None:
    """Drop the process's decision: the next CPU call measures again (tests; a machine whose load changed)."""
    global _chosen, settled
    _chosen, settled = None, None


def current() -> ThreadChoice | None:
    """The decision in force, or None before the first CPU call."""
    return _chosen


def decode_step(model, device) -> Callable[[], None]:
    """One decode step of `model` on top of a short prompt's KV cache (the cache grows by one per call)."""
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
    try:
        result = affinity.probe_threads(decode_step(model, device), sorted({1, cores}))
    except Exception as error:  # noqa: BLE001 - a measurement must not end the run; the report names the error
        affinity.set_threads(choice.threads)
        return ThreadChoice(choice.threads, choice.source, f"{choice.reason}; the probe failed: {error!r:.120}")
    return ThreadChoice(result.chosen, "probe", result.reason())


def _fixed_by_caller() -> ThreadChoice | None:
    """A count the environment or the caller set before the first call, or None."""
    if os.environ.get("OMP_NUM_THREADS"):
        return ThreadChoice(torch.get_num_threads(), "OMP_NUM_THREADS", "from the environment")
    if torch.get_num_threads() != (_IMPORT_THREADS if _applied is None else _applied):
        return ThreadChoice(torch.get_num_threads(), "torch.set_num_threads", "set by the caller")
    return None


def for_call(model, device: torch.device, threads: int | None = None) -> ThreadChoice | None:
    """Set torch's threads for one call on `model`: `threads` when given (capped at the usable cores), else the
    process's decision, made now (a probe on `model`) when none exists. None off the CPU."""
    global _chosen, settled
    if device.type != "cpu":
        return None
    if threads is not None:
        count, warning = capped(threads, "threads")
        if warning is not None and torch.get_num_threads() != count:
            print(f"assisted_backends: warning: {warning}", file=sys.stderr)
        return ThreadChoice(_apply(count), "threads=", "asked for")
    if _chosen is None:
        from assisted_backends.distributed.launch import launch_context

        choice = _fixed_by_caller()
        if choice is None:
            cores = affinity.usable_cores()
            start = ThreadChoice(_apply(cores), "usable cores", f"{cores} usable core(s)")
            choice = start if cores < 2 or launch_context() is not None else probe(start, model, device, cores)
        adopt(choice)
    elif torch.get_num_threads() != _applied:  # changed since by torch.set_num_threads: the caller's
        _chosen = ThreadChoice(_apply(torch.get_num_threads()), "torch.set_num_threads", "set by the caller")
    elif _applied != _chosen.threads:  # an earlier call's threads=: back to the process's choice
        _apply(_chosen.threads)
    settled = _applied
    return _chosen

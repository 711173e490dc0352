"""How `run`'s plan walks the package: the modules it visits, how often it comes back to one it had left, and how
often the round's token buffer crosses into and out of engine/round.py and engine/runner.py.

Command (from the repository root; `--root` measures another checkout, e.g. a `git worktree` of an older commit):

    python benchmarks/module_walk.py [--root PATH] [--json]

The call is tests/project/test_module_trace.py's: `generate(target, ids, assistant_model=draft, max_new_tokens=8)`
on the tiny Llama pair, on the CPU, traced the second time (the first imports); its default (adaptive) schedule
never drafts in 8 tokens, so the same call with `schedule="constant"` (γ = 4 every round) is traced too. Only
the frames inside `api.run.run` (the plan's execution; planning is outside) are traced, with `sys.setprofile`:

- modules: the package's files with a Python frame during `run`;
- comes back: a call into module M while M is already on the stack below with another package module between
  (the call left M and comes back to it: M -> N -> M), counted as distinct (caller function, callee function)
  edges and as call events;
- buffer crossings: a call with the token buffer among its arguments (`self` excepted: the buffer's own methods are
  the buffer acting on itself) from round.py or runner.py into another module ("out"), or from another module into
  round.py or runner.py ("in"), counted as distinct call sites (caller file:line -> callee function).

Deterministic counts, not timings: no load or CPU figure is needed beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

WATCHED = ("engine/round.py", "engine/runner.py")
BUFFER_TYPES = ("Slots", "OneSlotView")


def _arguments(frame) -> list:
    """The values of the frame's arguments, `self` left out."""
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return [frame.f_locals.get(name) for name in names if name != "self"]


CALLS = {"default": {}, "constant": {"schedule": "constant"}}


def walk(root: Path) -> dict:
    """Trace the module-trace test's greedy call (and its constant-schedule twin) under the checkout `root`."""
    here = Path(__file__).resolve().parent  # benchmarks/ holds a queue.py that would shadow the standard library's
    sys.path[:] = [str(root), str(root / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != here]
    import torch
    from tiny_models import tiny_model

    import assisted_backends
    from assisted_backends.api import generation

    package = Path(assisted_backends.__file__).parent
    if package != root / "assisted_backends":
        raise SystemExit(f"imported {package}, not the checkout at {root}: run from a clean interpreter")
    torch.set_num_threads(1)
    target, draft = tiny_model("llama", 0), tiny_model("llama", 1)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    results = {"root": str(root)}
    for name, options in CALLS.items():
        generation.generate(target, ids, assistant_model=draft, max_new_tokens=8, **options)  # imports
        real_run, tracer = generation.run, Tracer(str(package) + "/")
        generation.run = tracer.wrap(real_run)
        try:
            result = generation.generate(target, ids, assistant_model=draft, max_new_tokens=8, **options)
        finally:
            generation.run = real_run
        results[name] = {"rounds": result.stats.rounds, "drafted": result.stats.drafted, **tracer.figures()}
    return results


class Tracer:
    """The profile function and what it counts (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.seen: set[str] = set()
        self.back_edges: set[tuple[str, str]] = set()
        self.back_events = 0
        self.sites: set[tuple[str, str, str]] = set()

    def module(self, frame) -> str | None:
        name = frame.f_code.co_filename
        return name[len(self.prefix) :] if name.startswith(self.prefix) else None

    def wrap(self, function):
        def traced(*args, **kwargs):
            sys.setprofile(self.profile)
            try:
                return function(*args, **kwargs)
            finally:
                sys.setprofile(None)

        return traced

    def profile(self, frame, event, arg) -> None:
        if event != "call":
            return
        here = self.module(frame)
        if here is None:
            return
        self.seen.add(here)
        below = []  # the package modules on the stack below, nearest first
        caller = frame.f_back
        while caller is not None:
            name = self.module(caller)
            if name is not None:
                below.append((name, caller))
            caller = caller.f_back
        if not below:
            return
        caller_module, caller_frame = below[0]
        if caller_module != here and any(name == here for name, _ in below[1:]):
            self.back_events += 1
            self.back_edges.add((f"{caller_module}:{caller_frame.f_code.co_name}", f"{here}:{frame.f_code.co_name}"))
        if caller_module == here or frame.f_back is not caller_frame:
            return
        if not any(type(value).__name__ in BUFFER_TYPES for value in _arguments(frame)):
            return
        for watched in WATCHED:
            for direction, crosses in (
                (f"out of {watched}", caller_module == watched),
                (f"into {watched}", here == watched),
            ):
                if crosses:
                    self.sites.add(
                        (f"{caller_module}:{caller_frame.f_lineno}", f"{here}:{frame.f_code.co_name}", direction)
                    )

    def figures(self) -> dict:
        crossings = Counter(direction for _, _, direction in self.sites)
        return {
            "modules": len(self.seen),
            "module_list": sorted(self.seen),
            "comes_back_edges": len(self.back_edges),
            "comes_back_events": self.back_events,
            "comes_back_list": sorted(f"{a} -> {b}" for a, b in self.back_edges),
            "buffer_crossings": {
                watched: {d: crossings[f"{d} {watched}"] for d in ("into", "out of")} for watched in WATCHED
            },
            "buffer_crossing_sites": sorted(f"{direction}: {a} -> {b}" for a, b, direction in self.sites),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true", help="print the whole record as JSON")
    arguments = parser.parse_args()
    result = walk(arguments.root.resolve())
    if arguments.json:
        print(json.dumps(result, indent=2))
        return
    print(f"checkout: {result['root']}")
    for name in CALLS:
        figures = result[name]
        print(f"{name} schedule ({figures['rounds']} rounds, {figures['drafted']} tokens drafted):")
        print(f"  modules visited by run: {figures['modules']}")
        edges, calls = figures["comes_back_edges"], figures["comes_back_events"]
        print(f"  comes back to a module it had left: {edges} edges, {calls} calls")
        for watched, counts in figures["buffer_crossings"].items():
            print(f"  the buffer into / out of {watched}: {counts['into']} / {counts['out of']} call sites")


if __name__ == "__main__":
    main()

"""The engine thread: the one thread that owns the models and runs the batch (DESIGN.md "Serving").

HTTP handlers `submit` jobs to a bounded waiting queue and `cancel` them; the engine thread runs
`api.queue.generate_live`, the package's one decoding loop, with itself as the loop's arrival source: between
rounds the loop asks how many jobs wait (`pending`), takes them into free slots (the batch grows up to
`slots` rows), ends the rows of cancelled jobs, and hands every row's tokens back (`progress`, `finish`), which
the job passes to its handler's event loop. A call of the loop lasts while rows generate; when the batch
empties, the next waiting job starts the next call.

What one batch cannot mix is served one batch after another, in arrival order: greedy jobs share a batch;
sampled jobs share one when their temperature and top_p are equal (transformers' warpers act on the whole
batch); a seeded sampled job runs alone, so that its seed reproduces its tokens. A waiting job of another kind
than the running batch stops further joins, so that the batch drains and the job is next (no starvation).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from assisted_backends.serve.errors import queue_full, shutting_down
from assisted_backends.serve.metrics import Metrics

CALL_REQUESTS = 256  # jobs one call of the loop takes before it drains (bounds its per-row bookkeeping)
_ids = itertools.count()


@dataclass(eq=False)
class Job:
    """One request as the engine sees it. `deliver(kind, payload)` is called from the engine thread:
    ("progress", tokens so far), ("finish", every token), ("error", message)."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    deliver: Callable[[str, Any], None]
    admitted: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    done: bool = False
    number: int = field(default_factory=lambda: next(_ids))
    _sent: int = 0
    _cancel_reported: bool = False

    @property
    def key(self) -> tuple:
        """Jobs with equal keys may share a batch (see the module docstring)."""
        if self.temperature == 0.0:
            return ("greedy",)
        if self.seed is not None:
            return ("seeded", self.number)
        return ("sample", self.temperature, self.top_p)

    def arguments(self) -> dict[str, Any]:
        """The sampling options of the batch this job starts, as `generate` takes them."""
        if self.temperature == 0.0:
            return {"do_sample": False}
        top_p = None if self.top_p == 1.0 else self.top_p
        return {"do_sample": True, "temperature": self.temperature, "top_p": top_p, "top_k": 0, "seed": self.seed}


class Engine:
    """The waiting queue (at most `max_waiting` jobs), the engine thread, and the loop's call options
    (`arguments`: drafting, schedule, pad id), on `generator` (an `AssistedGenerator`)."""

    def __init__(
        self,
        generator: Any,
        slots: int,
        max_waiting: int,
        context: int,
        arguments: dict[str, Any],
        metrics: Metrics,
        threads: int | None = None,
        retry_after: int = 1,
    ) -> None:
        self.generator, self.slots, self.max_waiting, self.context = generator, slots, max_waiting, context
        self.arguments, self.metrics, self.threads, self.retry_after = arguments, metrics, threads, retry_after
        self.waiting: deque[Job] = deque()
        self.active: dict[int, Job] = {}  # the running call's jobs by their row index
        self.condition = threading.Condition()
        self.closing = False
        self.calls = 0
        self._thread = threading.Thread(target=self._run, name="assisted-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job`, or refuse it: 503 while shutting down, 429 when the waiting queue is full."""
        with self.condition:
            if self.closing:
                raise shutting_down()
            if len(self.waiting) >= self.max_waiting:
                raise queue_full(len(self.waiting), self.retry_after)
            self.waiting.append(job)
            self.metrics.queue_depth.set(len(self.waiting))
            self.metrics.prompt_tokens.inc(len(job.prompt))
            self.condition.notify()

    def cancel(self, job: Job) -> None:
        """The job's client left or has what it wanted: its row ends before the next round, or it never joins."""
        with self.condition:
            job.cancelled = True
            self.condition.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Take no more jobs, finish the queued and running ones, and end the thread."""
        with self.condition:
            self.closing = True
            self.condition.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def busy(self) -> int:
        return len(self.active)

    def depth(self) -> int:
        return len(self.waiting)

    # the engine thread

    def _run(self) -> None:
        import torch

        if self.threads is not None:  # OpenMP's thread count is per thread: set it for this one
            torch.set_num_threads(self.threads)
        while True:
            with self.condition:
                self._purge()
                while not self.waiting and not self.closing:
                    self.condition.wait(0.5)
                    self._purge()
                if not self.waiting:
                    return
                key = self.waiting[0].key
                arguments = {**self.arguments, **self.waiting[0].arguments()}
            self._call(_Call(self, key), arguments)

    def _call(self, call: _Call, arguments: dict[str, Any]) -> None:
        from assisted_backends.api.queue import generate_live

        self.calls += 1
        self.metrics.call_started()
        try:
            if call.pending():
                generate_live(
                    self.generator, call, self.slots, self.context, call.finish, call.progress, call.round,
                    **arguments,
                )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - the jobs of the call fail, the server goes on
            traceback.print_exc(file=sys.stderr)
            for job in list(self.active.values()):
                job.done = True
                job.deliver("error", f"the engine failed on this batch: {type(error).__name__}: {error}")
        finally:
            self.active.clear()
            self.metrics.slots_busy.set(0)

    def _purge(self) -> None:
        """Drop waiting jobs whose clients left (the lock is held)."""
        if any(job.cancelled for job in self.waiting):
            self.waiting = deque(job for job in self.waiting if not job.cancelled)
            self.metrics.queue_depth.set(len(self.waiting))


class _Call:
    """One call of the loop: the arrival source it polls (`api.queue.LiveSource`) and its callbacks."""

    def __init__(self, engine: Engine, key: tuple) -> None:
        self.engine, self.key, self.taken = engine, key, 0

    def pending(self) -> int:
        engine = self.engine
        with engine.condition:
            engine._purge()
            if self.taken >= CALL_REQUESTS:
                return 0
            count = 0
            for job in engine.waiting:
                if job.key != self.key:
                    break
                count += 1
            return min(count, CALL_REQUESTS - self.taken)

    def take(self):
        import torch

        engine = self.engine
        with engine.condition:
            job = engine.waiting.popleft()
            engine.metrics.queue_depth.set(len(engine.waiting))
        index, self.taken = self.taken, self.taken + 1
        engine.active[index] = job
        engine.metrics.slots_busy.set(len(engine.active))
        return index, torch.tensor(job.prompt, dtype=torch.long), job.max_tokens

    def cancelled(self) -> list[int]:
        ended = []
        for index, job in self.engine.active.items():
            if job.cancelled and not job._cancel_reported:
                job._cancel_reported = True
                ended.append(index)
        return ended

    def progress(self, index: int, tokens) -> None:
        job = self.engine.active.get(index)
        if job is None or job.cancelled:
            return
        count = tokens.shape[0]
        if count > job._sent:
            if job._sent == 0:
                self.engine.metrics.ttft.observe(time.monotonic() - job.admitted)
            self.engine.metrics.tokens(count - job._sent)
            job._sent = count
            job.deliver("progress", tokens.tolist())

    def finish(self, index: int, tokens) -> None:
        engine = self.engine
        job = engine.active.pop(index, None)
        engine.metrics.slots_busy.set(len(engine.active))
        if job is None:
            return
        job.done = True
        count = tokens.shape[0]
        if job._sent == 0 and count:
            engine.metrics.ttft.observe(time.monotonic() - job.admitted)
        engine.metrics.tokens(count - job._sent)
        engine.metrics.duration.observe(time.monotonic() - job.admitted)
        job.deliver("finish", tokens.tolist())

    def round(self, stats) -> None:
        self.engine.metrics.drafting(stats.drafted, stats.accepted)

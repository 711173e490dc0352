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

Jobs that ask for log-probabilities (`Job.logprobs`) share a batch with each other only: their call keeps every
committed token's log-probability and top tokens (`engine.outputs.LogprobRecord`, from the scores the token was
chosen from), and each job gets its own entries with its tokens (`Job.entries`, filled before the tokens are
delivered); other batches compute none.

Suffix decoding's index of earlier requests (`drafters.suffix.SuffixCache`) is filled here, with each finished
job's prompt and tokens. With `isolated` (API keys set), every tenant (key) has its own index, and jobs of
different tenants do not share a batch: one client's acceptance rate cannot reveal another's text.

The thread is supervised: a batch that raises fails its own jobs (500) and the engine goes on; anything that
ends the thread itself fails every job waiting or running, refuses new ones (503), and calls `on_fault`
(the server then exits with a nonzero status, for its supervisor to restart it).
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

from assisted_backends.serve.errors import engine_failed, queue_full, shutting_down
from assisted_backends.serve.metrics import Metrics

CALL_REQUESTS = 256  # jobs one call of the loop takes before it drains (bounds its per-row bookkeeping)
_ids = itertools.count()


@dataclass(eq=False)
class Job:
    """One request (one choice of it) as the engine sees it. `deliver(kind, payload)` is called from the engine
    thread: ("progress" | "finish", (start, the tokens from position `start` on)), ("error", message). `tenant`:
    the client's key, when suffix indexes are kept per key; `top_k`, `min_p`: the batch's warpers with the
    sampling options; `penalties`: (presence, frequency, repetition), its row's own processors; `grammar`: its
    response_format's processor (`structured`, copied for its row), after the penalties; `logprobs`: the top tokens
    wanted with each token's log-probability (None: none), whose `entries` (token, logprob, [(token, logprob)] of
    the top) the engine thread fills before it delivers the tokens."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    deliver: Callable[[str, Any], None]
    tenant: str | None = None
    top_k: int = 0
    min_p: float = 0.0
    penalties: tuple[float, float, float] = (0.0, 0.0, 1.0)
    grammar: Any = None
    logprobs: int | None = None
    entries: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    admitted: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    done: bool = False
    number: int = field(default_factory=lambda: next(_ids))
    _sent: int = 0
    _cancel_reported: bool = False

    @property
    def key(self) -> tuple:
        """Jobs with equal keys may share a batch (see the module docstring); the tenant first."""
        scored = self.logprobs is not None
        if self.temperature == 0.0:
            return (self.tenant, scored, "greedy")
        if self.seed is not None:
            return (self.tenant, scored, "seeded", self.number)
        return (self.tenant, scored, "sample", self.temperature, self.top_p, self.top_k, self.min_p)

    def arguments(self) -> dict[str, Any]:
        """The sampling options of the batch this job starts, as `generate` takes them."""
        if self.temperature == 0.0:
            return {"do_sample": False}
        top_p = None if self.top_p == 1.0 else self.top_p
        min_p = self.min_p or None
        return {"do_sample": True, "temperature": self.temperature, "top_p": top_p, "top_k": self.top_k,
                "min_p": min_p, "seed": self.seed}  # fmt: skip

    def processors(self) -> list:
        """The row's own logits processors: its penalties (`options.penalties`), counted after its prompt."""
        from assisted_backends.options.penalties import penalty_processors

        grammar = [self.grammar] if self.grammar is not None else []
        return [*penalty_processors(*self.penalties, len(self.prompt)), *grammar]


class Engine:
    """The waiting queue (at most `max_waiting` jobs, places reserved before a prompt is tokenized included), the
    engine thread, and the loop's call options (`arguments`: drafting, schedule, pad id), on `generator` (an
    `AssistedGenerator`); `isolated`: one suffix index per tenant (see the module docstring)."""

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
        isolated: bool = False,
    ) -> None:
        self.generator, self.slots, self.max_waiting, self.context = generator, slots, max_waiting, context
        self.arguments, self.metrics, self.threads, self.retry_after = arguments, metrics, threads, retry_after
        self.indexes = SuffixIndexes(arguments.get("suffix_cache"), isolated)
        self.isolated = isolated  # jobs carry their tenant: suffix indexes and prefix cache salts per key
        self.on_fault: Callable[[str], None] | None = None
        self.failure: str | None = None  # why the thread ended, once it failed
        self.reserved = 0  # places of the waiting queue held by prompts being tokenized
        self.waiting: deque[Job] = deque()
        self.active: dict[int, Job] = {}  # the running call's jobs by their row index
        self.condition = threading.Condition()
        self.closing = False
        self.calls = 0
        self._thread = threading.Thread(target=self._run, name="assisted-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def reserve(self, count: int = 1) -> None:
        """Hold `count` places in the waiting queue (a request's choices), or refuse: 503 while shutting down or
        failed, 429 when they do not fit. Called before the prompt is tokenized, so that a full queue costs no
        tokenization; `submit` or `release` gives each place back."""
        with self.condition:
            if self.failure is not None:
                raise engine_failed(self.failure)
            if self.closing:
                raise shutting_down()
            if len(self.waiting) + self.reserved + count > self.max_waiting:
                raise queue_full(len(self.waiting) + self.reserved, self.retry_after)
            self.reserved += count

    def release(self, count: int = 1) -> None:
        """Give back `count` places `reserve` held, without jobs."""
        with self.condition:
            self.reserved -= count

    def submit(self, job: Job) -> None:
        """Queue `job` in the place `reserve` held (503 if the engine stopped or failed since)."""
        with self.condition:
            self.reserved -= 1
            if self.failure is not None:
                raise engine_failed(self.failure)
            if self.closing:
                raise shutting_down()
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
        try:
            self._serve()
        except BaseException as error:  # noqa: BLE001 - supervision: whatever ended the thread fails its jobs
            traceback.print_exc(file=sys.stderr)
            self._fail(f"the engine thread failed: {type(error).__name__}: {error}")

    def _fail(self, message: str) -> None:
        """Fail every job waiting or running with `message`, refuse new ones, and tell `on_fault`."""
        with self.condition:
            self.failure, self.closing = message, True
            jobs = [*self.waiting, *self.active.values()]
            self.waiting.clear()
            self.active.clear()
        for job in jobs:
            job.done = True
            job.deliver("error", message)
        if self.on_fault is not None:
            self.on_fault(message)

    def _serve(self) -> None:
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
                head = self.waiting[0]
                arguments = {**self.arguments, **head.arguments()}
                if self.indexes.shared is not None:
                    arguments["suffix_cache"] = self.indexes.of(head.tenant)
                prefix = getattr(self.generator, "prefix_cache", None)
                if prefix is not None and self.isolated:  # a tenant's prefixes are named under its own salt
                    arguments["prefix_cache"] = prefix.cache.scope(head.tenant or "")
            self._call(_Call(self, head.key, _record(head)), arguments)

    def _call(self, call: _Call, arguments: dict[str, Any]) -> None:
        from assisted_backends.api.queue import generate_live

        self.calls += 1
        self.metrics.call_started()
        if call.record is not None:
            arguments = {**arguments, "logprobs": call.record}
        try:
            if call.pending():
                stats = generate_live(
                    self.generator, call, self.slots, self.context, call.finish, call.progress, call.round,
                    **arguments,
                )  # fmt: skip
                prefix = getattr(self.generator, "prefix_cache", None)
                if prefix is not None:
                    self.metrics.prefix_cache(stats.prefix_reused, prefix.cache)
        except Exception as error:  # noqa: BLE001 - the jobs of the call fail, the server goes on
            traceback.print_exc(file=sys.stderr)
            for job in list(self.active.values()):
                job.done = True
                job.deliver("error", f"the engine failed on this batch: {type(error).__name__}: {error}")
        # anything else ends the thread with `active` kept: `_run` fails those jobs with the waiting ones
        self.active.clear()
        self.metrics.slots_busy.set(0)

    def _purge(self) -> None:
        """Drop waiting jobs whose clients left (the lock is held)."""
        if any(job.cancelled for job in self.waiting):
            self.waiting = deque(job for job in self.waiting if not job.cancelled)
            self.metrics.queue_depth.set(len(self.waiting))


def _record(head: Job) -> Any:
    """The log-probabilities a call keeps: a `LogprobRecord` of the most top tokens a job may ask for, where its jobs
    ask (the batch's key holds whether they do), else None."""
    if head.logprobs is None:
        return None
    from assisted_backends.engine.outputs import LogprobRecord
    from assisted_backends.options.fields import MAX_TOP_LOGPROBS

    return LogprobRecord(MAX_TOP_LOGPROBS)


class _Call:
    """One call of the loop: the arrival source it polls (`api.queue.LiveSource`), its callbacks and its jobs'
    log-probabilities (`record`: None where they ask none)."""

    def __init__(self, engine: Engine, key: tuple, record: Any = None) -> None:
        self.engine, self.key, self.taken, self.record = engine, key, 0, record

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
        return index, torch.tensor(job.prompt, dtype=torch.long), job.max_tokens, job.processors()

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
        count, start = tokens.shape[0], job._sent
        if count > start:
            if start == 0:
                self.engine.metrics.ttft.observe(time.monotonic() - job.admitted)
            self.engine.metrics.tokens(count - start)
            job._sent = count
            self._entries(index, job, count)
            job.deliver("progress", (start, tokens[start:].tolist()))

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
        engine.metrics.tokens(max(count - job._sent, 0))
        engine.metrics.duration.observe(time.monotonic() - job.admitted)
        start = min(job._sent, count)
        self._entries(index, job, count)
        job.deliver("finish", (start, tokens[start:].tolist()))
        engine.indexes.remember(job, tokens)

    def _entries(self, index: int, job: Job, count: int) -> None:
        """The job's log-probability entries through its token `count` (row `index` of the record), each with the
        job's own number of top tokens; the record forgets a row that ended."""
        if self.record is None or job.logprobs is None:
            return
        kept, start, top = self.record.row(index), len(job.entries), job.logprobs
        tokens, logprobs = kept.tokens[start:count].tolist(), kept.logprobs[start:count].tolist()
        ids, values = kept.top_ids[start:count, :top].tolist(), kept.top_logprobs[start:count, :top].tolist()
        job.entries.extend((token, value, list(zip(i, v))) for token, value, i, v in zip(tokens, logprobs, ids, values))
        if job.done:
            self.record.drop(index)

    def round(self, stats) -> None:
        self.engine.metrics.drafting(stats.drafted, stats.accepted)


class SuffixIndexes:
    """Suffix decoding's index of earlier requests (`shared`, None without suffix decoding), or with `isolated`
    one index per tenant, each bounded to the shared one's token count."""

    def __init__(self, shared: Any, isolated: bool) -> None:
        self.shared, self.isolated = shared, isolated
        self.tenants: dict[str | None, Any] = {}

    @property
    def per_tenant(self) -> bool:
        """Whether jobs carry their tenant (isolated indexes in use)."""
        return self.isolated and self.shared is not None

    def of(self, tenant: str | None) -> Any:
        """The index `tenant`'s jobs draft from and fill."""
        if not self.per_tenant:
            return self.shared
        if tenant not in self.tenants:
            from assisted_backends.drafters.suffix.cache import SuffixCache

            shared = self.shared
            self.tenants[tenant] = SuffixCache(shared.max_tokens, shared.segment_tokens, shared.token_trees)
        return self.tenants[tenant]

    def remember(self, job: Job, tokens) -> None:
        """Index a finished job's prompt and tokens (in its tenant's index)."""
        index = self.of(job.tenant)
        if index is not None:
            index.add(job.prompt + tokens.tolist())

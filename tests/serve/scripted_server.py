"""An in-process `assisted-serve` whose engine runs a scripted decoding loop instead of a model: it starts in a
second, and its rounds are the test's to pace. The app, engine, events, limits and keys are the real ones, on the
demo pair's tokenizer; only `api.queue.generate_live` is replaced (`ScriptedLoop`, by `pytest`'s monkeypatch or
`install`), and uvicorn runs on a thread (`running`)."""

from __future__ import annotations

import contextlib
import copy
import socket
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

CONTEXT = 200_000


class ScriptedLoop:
    """`generate_live`'s stand-in: rows join up to `slots`; each round every row gets `per_round` more tokens of
    `answer` (cycled), `round_s` apart; a row ends at its limit or when cancelled. `fault`: raised at the first
    round (an exception that ends the engine thread when it is no `Exception`)."""

    def __init__(self, answer: list[int], per_round: int = 1, round_s: float = 0.0, fault=None) -> None:
        self.answer, self.per_round, self.round_s, self.fault = answer, per_round, round_s, fault
        self.calls: list[dict] = []  # each call's arguments
        self.processors: list[list] = []  # each row's own logits processors, in the order taken
        self.cancelled: list[tuple[int, int]] = []  # (row, tokens it had) of each cancelled row

    def __call__(self, generator, source, slots, context, on_finish, on_progress=None, on_round=None, **arguments):
        self.calls.append(arguments)
        rows: dict[int, tuple[int, list[int]]] = {}
        while True:
            while len(rows) < slots and source.pending():
                index, _, limit, own = source.take()
                self.processors.append(own)
                rows[index] = (limit, [])
            for index in source.cancelled():
                if index in rows:
                    tokens = rows.pop(index)[1]
                    self.cancelled.append((index, len(tokens)))
                    on_finish(index, torch.tensor(tokens, dtype=torch.long))
            if not rows:
                return SimpleNamespace(drafted=0, accepted=0)
            if self.fault is not None:
                raise self.fault
            for index, (limit, tokens) in list(rows.items()):
                for _ in range(min(self.per_round, limit - len(tokens))):
                    tokens.append(self.answer[len(tokens) % len(self.answer)])
                if len(tokens) >= limit:
                    del rows[index]
                    on_finish(index, torch.tensor(tokens, dtype=torch.long))
                elif on_progress is not None:
                    on_progress(index, torch.tensor(tokens, dtype=torch.long))
            if on_round is not None:
                on_round(SimpleNamespace(drafted=0, accepted=0))
            time.sleep(self.round_s)


@dataclass
class CallLog:
    """Every tokenizer call: (the instance's id, the thread's id, the method)."""

    calls: list[tuple[int, int, str]] = field(default_factory=list)

    def count(self, method: str) -> int:
        return sum(1 for _, _, name in self.calls if name == method)

    def threads_per_instance(self) -> dict[int, set[int]]:
        found: dict[int, set[int]] = {}
        for instance, thread, _ in self.calls:
            found.setdefault(instance, set()).add(thread)
        return found


class LoggedTokenizer:
    """A tokenizer that logs each call (a deep copy logs to the same `CallLog`, as itself)."""

    def __init__(self, inner, log: CallLog) -> None:
        self.inner, self.log = inner, log
        self.chat_template = inner.chat_template
        self.eos_token_id = inner.eos_token_id

    def _note(self, method: str) -> None:
        self.log.calls.append((id(self), threading.get_ident(), method))

    def __call__(self, *args, **kwargs):
        self._note("encode")
        return self.inner(*args, **kwargs)

    def decode(self, *args, **kwargs):
        self._note("decode")
        return self.inner.decode(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        self._note("template")
        return self.inner.apply_chat_template(*args, **kwargs)

    def get_vocab(self):
        return self.inner.get_vocab()

    def __deepcopy__(self, memo):
        return LoggedTokenizer(copy.deepcopy(self.inner, memo), self.log)


def demo_tokenizer():
    from transformers import AutoTokenizer

    from assisted_backends.demo.pair import shipped_pair

    return AutoTokenizer.from_pretrained(str(shipped_pair().target_dir))


def scripted_state(tokenizer, slots: int = 2, max_waiting: int = 4, keys=(), origins=(), isolated=False,
                   arguments=None, **limits):  # fmt: skip
    """A `ServerState` on `tokenizer` whose engine's generator is never called (the loop is scripted)."""
    from assisted_backends.serve.app import ServerState
    from assisted_backends.serve.engine import Engine
    from assisted_backends.serve.limits import Limits
    from assisted_backends.serve.metrics import Metrics
    from assisted_backends.serve.prompts import PromptMaker
    from assisted_backends.serve.security import Keys

    metrics = Metrics(slots)
    engine = Engine(object(), slots, max_waiting, CONTEXT, dict(arguments or {}), metrics, isolated=isolated)
    prompts = PromptMaker.of(tokenizer, None, CONTEXT, 4096)
    return ServerState(engine, prompts, "demo", frozenset({tokenizer.eos_token_id}), metrics, Limits(**limits), 0,
                       Keys.of(keys) if keys else None, tuple(origins))  # fmt: skip


def listening_socket(send_buffer: int | None = None) -> socket.socket:
    """A loopback socket on a free port (`send_buffer`: the accepted connections' kernel send buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@contextlib.contextmanager
def running(state, send_buffer: int | None = None, stop_s: float = 30.0):
    """uvicorn serving `state` on a thread (`runner.build_server`); yields the base URL; stops it on exit."""
    from assisted_backends.serve.runner import build_server

    server = build_server(state, "critical")
    sock = listening_socket(send_buffer)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the in-process server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread
    finally:
        server.should_exit = True
        thread.join(stop_s)
        sock.close()

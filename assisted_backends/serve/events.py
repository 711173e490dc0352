"""A job's state, from the engine thread to the request's handler on the event loop, in bounded memory.

The engine delivers each round's new tokens (`progress`), the row's last ones (`finish`) or a failure (`error`);
`JobEvents` keeps one list of the row's tokens and its newest state, never a backlog of events: a handler that
stops reading (a stream whose client stopped reading) costs the tokens of its own answer and nothing per round.
`wait()` returns once something changed since the handler last looked; the choices of one request (`n` > 1)
share one `changed` event, so that their handler waits for whichever changes first (`poll` each).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Update:
    """What changed since the handler last looked: the tokens added (`new`), the row's token count now (`count`:
    fewer than before plus `new` only if the engine dropped tokens it had sent), whether the row ended (`final`),
    and the engine's message if it failed."""

    new: list[int]
    count: int
    final: bool
    error: str | None = None


class JobEvents:
    """One job's tokens and state. `deliver` runs on the engine thread; `wait` on the handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, changed: asyncio.Event | None = None) -> None:
        self.loop = loop
        self.tokens: list[int] = []
        self.final = False
        self.error: str | None = None
        self._read = 0  # tokens the handler has seen
        self._lock = threading.Lock()
        self._changed = changed if changed is not None else asyncio.Event()
        self._wake_scheduled = False

    def deliver(self, kind: str, payload) -> None:
        """The engine thread: ("progress" | "finish", (start, tokens from `start` on)) or ("error", message)."""
        with self._lock:
            if kind == "error":
                self.error, self.final = str(payload), True
            else:
                start, new = payload
                del self.tokens[start:]
                self.tokens.extend(new)
                self._read = min(self._read, start)
                self.final = self.final or kind == "finish"
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._wake_scheduled = False
        self._changed.set()

    def poll(self) -> Update | None:
        """The change since the handler last looked, or None (once final, every poll returns the final state)."""
        with self._lock:
            if self._read < len(self.tokens) or self.final:
                new = self.tokens[self._read :]
                self._read = len(self.tokens)
                return Update(new, len(self.tokens), self.final, self.error)
            return None

    async def wait(self) -> Update:
        """The next change (waits until there is one)."""
        while True:
            self._changed.clear()
            update = self.poll()
            if update is not None:
                return update
            await self._changed.wait()

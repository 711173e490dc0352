"""One tokenizer copy per thread: a fast tokenizer's Rust object must never be used by two threads at once (it
raises "Already borrowed"), and the server tokenizes on its tokenizing thread while it detokenizes on the event
loop. `PerThread.get()` gives the calling thread its own copy (made once, on first use)."""

from __future__ import annotations

import copy
import threading


class PerThread:
    """`original` (read by no thread once serving) and one deep copy for each thread that asks."""

    def __init__(self, original: object) -> None:
        self.original = original
        self._local = threading.local()
        self._lock = threading.Lock()

    def get(self) -> object:
        """This thread's own copy."""
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            with self._lock:  # copying reads the original: one copy at a time
                tokenizer = copy.deepcopy(self.original)
            self._local.tokenizer = tokenizer
        return tokenizer

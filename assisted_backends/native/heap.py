"""Handing freed heap memory back to the system: glibc keeps the pages of freed blocks for reuse, and they stay
resident (a load's replaced copies, a long prefill's temporaries). `trim_heap()` is glibc's `malloc_trim(0)`,
which returns every whole free page of every arena; elsewhere it does nothing. It changes no value: only which
pages are resident."""

from __future__ import annotations

import ctypes
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def trim_heap() -> bool:
    """Return the heap's free pages to the system (whether the C library could)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False

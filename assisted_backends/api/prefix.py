"""`prefix_cache=`: which prefix cache (`engine.prefix_cache.PrefixCache`) a call reuses and fills, if any.

- None (the default): the process's cache for the target where reuse is exact, else off. Exact: the native decoder
  step (`native.decoder_model.NativeCausalLM`, a `.gguf` target on the CPU), which computes each row alone in a fixed
  order, so a prefix restored from an earlier pass holds the bits this pass would compute (tests/api/
  test_prefix_cache.py). transformers' modeling is not: its float GEMMs round differently by the number of
  positions a pass feeds, so a restored prefix may differ in the last bits (fp32: logits within rounding, greedy
  tokens equal except at near-ties), and the default there is off;
- True: the process's cache for the target, on any model (on transformers' modeling: equal up to that rounding);
- False: off;
- a `PrefixCache`: that one (it serves one model), or a `PrefixScope` (`cache.scope(salt)`: one tenant's view).

`prefill_chunk=` (queues and the server): a prompt that joins running rows has its own pass computed a chunk of
columns per round (`engine.row_pass`), so the running rows wait at most one chunk between their rounds. None (the
default): `PREFILL_CHUNK` where a pass in chunks is the same bits as one pass (`exact_reuse`), else whole; 0: whole;
n > 0: chunks of n anywhere (on transformers' modeling: equal up to the rounding above).

One cache per model, kept while the model lives (`cache_for`): every entry point on that model shares it. Static
shapes and multi-rank launches never reuse (`api.run`).
"""

from __future__ import annotations

import weakref
from typing import Any

from assisted_backends.engine.prefix_cache import PrefixCache, PrefixScope
from assisted_backends.options import ranges

PREFILL_CHUNK = 256  # columns of a joining prompt's pass per round: ~0.2-0.4 s of a 2-core CPU's prefill
_CACHES: weakref.WeakKeyDictionary[Any, PrefixCache] = weakref.WeakKeyDictionary()


def exact_reuse(model: Any) -> bool:
    """Whether `model` computes each row alone in a fixed order (the native decoder step: it makes its own cache)."""
    return callable(getattr(model, "new_native_cache", None))


def cache_for(model: Any) -> PrefixCache:
    """The process's prefix cache for `model` (made on first use)."""
    cache = _CACHES.get(model)
    if cache is None:
        cache = _CACHES[model] = PrefixCache()
        cache.bind(model)
    return cache


def prefix_scope(value: Any, model: Any) -> PrefixScope | None:
    """What `prefix_cache=value` means for a call on `model` (see the module docstring); None: no reuse."""
    if value is None:
        return cache_for(model).scope() if exact_reuse(model) else None
    if value is True:
        return cache_for(model).scope()
    if value is False:
        return None
    if isinstance(value, PrefixCache):
        value = value.scope()
    if isinstance(value, PrefixScope):
        value.cache.bind(model)
        return value
    raise ValueError(
        f"prefix_cache={value!r}: give True (this process's cache for the model), False (off), None (on where "
        "exact), a PrefixCache or cache.scope(salt)"
    )


def prefill_chunk(value: int | None, model: Any) -> int | None:
    """What `prefill_chunk=value` means for a queue on `model` (see the module docstring); None: whole passes."""
    if value is None:
        return PREFILL_CHUNK if exact_reuse(model) else None
    return ranges.check_integer("prefill_chunk", value, minimum=0) or None

"""`PrefixCache`: keys and values of earlier requests' token prefixes, kept across calls, bounded in bytes.

A request that resends a long prefix (a chat's history, an agent's tool catalogue) has the keys and values of that
prefix restored from here and prefills only the rest (`engine.prefix_reuse`). What is kept: fixed-size blocks of
`block_tokens` committed tokens, each holding every layer's keys and values of those positions, [layers, 2, H_kv,
block_tokens, D_h]. A block is named by a chained hash h_i = H(h_{i−1} ‖ tokens of block i), with h_0 = H(salt): a
block's name covers every token before it, so a lookup walks the prompt's full blocks from the start and stops at
the first name not held. The salt (a tenant) roots each tenant's chains apart: one tenant's prompts never find
another's blocks, so its time to first token cannot reveal another's prefix.

Why hashed blocks and not a radix tree: a lookup and an insert are one dictionary probe per block, eviction drops
one block (least recently used first) with no tree to rebalance, and a block's bytes are fixed, so the byte bound is
exact. What is lost is reuse of a prefix's trailing partial block (fewer than `block_tokens` tokens per request).
Blake2b names (not Python's `hash`) keep collisions out of a client's reach; a match also compares each block's tokens
and parent, so a collision could only ever miss, never restore a wrong block.

Eviction: least recently used, by block. A lookup touches the blocks it matched from the last to the first, so a
parent is always at least as recent as its children and is evicted after them (a chain is shortened from its end).
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_MAX_BYTES = 512 << 20  # 512 MiB: ~11,000 tokens of SmolLM2-135M's fp32 keys and values
DEFAULT_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class _Block:
    """One block: its tokens, its parent's name, every layer's keys and values [layers, 2, H_kv, n, D_h]."""

    tokens: tuple[int, ...]
    parent: bytes
    kv: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass(frozen=True)
class PrefixMatch:
    """The longest cached prefix of a lookup: `length` tokens (a multiple of the block size) and their keys and
    values, one tensor per block [layers, 2, H_kv, block_tokens, D_h]."""

    length: int
    blocks: tuple[torch.Tensor, ...]

    def kv(self) -> torch.Tensor:
        """[layers, 2, H_kv, length, D_h]: the blocks joined along the positions."""
        return torch.cat(self.blocks, dim=3)


class PrefixCache:
    """Blocks of earlier prefixes' keys and values, at most `max_bytes` of them (see the module docstring). One
    cache serves one model (`bind`): keys and values are the model's own."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"PrefixCache(max_bytes=...) must be an int >= 0, got {max_bytes!r}")
        if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
            raise ValueError(f"PrefixCache(block_tokens=...) must be an int >= 1, got {block_tokens!r}")
        self.max_bytes, self.block_tokens = max_bytes, block_tokens
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()  # least recently used first
        self.nbytes = 0
        self.lookups = 0  # prompts looked up
        self.looked_up_tokens = 0  # their tokens
        self.reused_tokens = 0  # tokens restored instead of computed
        self.evicted_blocks = 0
        self._model: weakref.ref | None = None
        self._lock = threading.Lock()  # a server's engine thread and callers' threads may share one cache

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    @property
    def hit_rate(self) -> float:
        """Tokens restored / tokens looked up (0 before any lookup)."""
        return self.reused_tokens / self.looked_up_tokens if self.looked_up_tokens else 0.0

    def scope(self, salt: str = "") -> PrefixScope:
        """This cache as one tenant (`salt`) sees it."""
        return PrefixScope(self, salt)

    def bind(self, model: Any) -> None:
        """Serve `model` only (the first model bound); another model is one ValueError while the first lives (its keys
        differ), and once it is gone the blocks it left are dropped."""
        with self._lock:
            owner = self._model() if self._model is not None else None
            if owner is model:
                return
            if owner is not None:
                raise ValueError(
                    "prefix_cache: this PrefixCache holds another model's keys and values; give each model its own "
                    "(prefix_cache=True keeps one per model)"
                )
            self._blocks.clear()
            self.nbytes = 0
            self._model = weakref.ref(model)

    def match(self, tokens: Sequence[int], salt: str = "", limit: int | None = None) -> PrefixMatch:
        """The longest run of full blocks held for `tokens` (at most `limit` tokens of them), touched as used."""
        size = self.block_tokens
        usable = len(tokens) if limit is None else min(limit, len(tokens))
        with self._lock:
            names, parent = [], _root(salt)
            for begin in range(0, usable - size + 1, size):
                chunk = tuple(tokens[begin : begin + size])
                name = _name(parent, chunk)
                block = self._blocks.get(name)
                if block is None or block.tokens != chunk or block.parent != parent:
                    break
                names.append(name)
                parent = name
            for name in reversed(names):  # parents end up more recent than their children
                self._blocks.move_to_end(name)
            return PrefixMatch(len(names) * size, tuple(self._blocks[name].kv for name in names))

    def record(self, looked_up: int, reused: int) -> None:
        """A prompt pass looked up `looked_up` tokens and restored `reused` of them (`hit_rate`)."""
        with self._lock:
            self.lookups += 1
            self.looked_up_tokens += looked_up
            self.reused_tokens += reused

    def store(self, tokens: Sequence[int], read: Callable[[int, int], torch.Tensor], salt: str = "") -> int:
        """Keep the full blocks of `tokens` not held yet; `read(begin, end)` gives the keys and values of positions
        [begin, end) [layers, 2, H_kv, end − begin, D_h], a tensor of its own (called only for blocks added). Returns
        the blocks added."""
        size, added = self.block_tokens, 0
        with self._lock:
            names, parent = [], _root(salt)
            for begin in range(0, len(tokens) - size + 1, size):
                chunk = tuple(tokens[begin : begin + size])
                name = _name(parent, chunk)
                if name not in self._blocks:
                    block = _Block(chunk, parent, read(begin, begin + size))
                    if block.nbytes > self.max_bytes:
                        break
                    self._blocks[name] = block
                    self.nbytes += block.nbytes
                    added += 1
                names.append(name)
                parent = name
            for name in reversed(names):
                self._blocks.move_to_end(name)
            self._evict()
        return added

    def _evict(self) -> None:
        """Drop the least recently used blocks until the bytes held are within `max_bytes`."""
        while self.nbytes > self.max_bytes:
            _, block = self._blocks.popitem(last=False)
            self.nbytes -= block.nbytes
            self.evicted_blocks += 1


@dataclass(frozen=True)
class PrefixScope:
    """A prefix cache as one call uses it: the cache and the salt its blocks are named under (a tenant)."""

    cache: PrefixCache
    salt: str = ""


def _root(salt: str) -> bytes:
    return hashlib.blake2b(b"prefix-cache\0" + salt.encode(), digest_size=16).digest()


def _name(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()

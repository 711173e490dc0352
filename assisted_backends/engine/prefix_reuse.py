"""`PrefixReuse`: a call's prompt passes read earlier requests' keys and values from a `PrefixCache`, and its
committed tokens' keys and values go back into it.

Where the engine asks (`engine.runner.ModelRunner.forward`, `engine.round.commit`):
- a prompt pass (a forward over an empty dynamic cache that keeps the last logits only: the call's prefill, or a
  queue's one-row pass over a joining prompt) first looks up each row's tokens (row b from its left padding p_b).
  With m_b tokens matched, the columns [0, c) with c = min_b (p_b + m_b) are restored (row b's [p_b, c) from its
  blocks, its padding columns zeros, masked) and only columns [c, q) are fed; m_b stops one token before the row's
  end, so the last prompt token is always computed and gives the first token's logits. After the pass every row's
  prompt is stored;
- a row that ends (`keep_finished`) stores its committed tokens, its answer included, but the newest (pending: its
  key was never computed as committed). Nothing past a row's committed tokens is ever read: a rolled-back draft
  never enters the cache.

Exactness: a restored position holds the bits a pass over that prefix computed; it equals what this pass would have
computed where the model computes each row alone in a fixed order, whatever the positions fed with it (the native
decoder step). Elsewhere the reuse is opt-in (`api.prefix.prefix_scope`). Not used (the pass runs as before): static
shapes and multi-rank launches, per-column inputs or masks with holes (they change the keys: `api.run` attaches
none), a drafter tapping the target's hidden states (it needs every position's: rows are still stored), caches other
than the native one and transformers' `DynamicCache`.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from assisted_backends import hf_compat
from assisted_backends.engine.kv_cache import CacheLayout
from assisted_backends.engine.prefix_cache import PrefixMatch, PrefixScope
from assisted_backends.engine.slots import Slots


class PrefixReuse:
    """One call's use of a prefix cache (`scope`: the cache and the call's salt) for the target's cache (`layout`,
    where finished rows are read); `reused` counts the prompt tokens restored instead of computed, over every prompt
    pass of the call."""

    def __init__(self, scope: PrefixScope, layout: CacheLayout) -> None:
        self.scope, self.layout = scope, layout
        self.reused = 0

    def restore(self, layout: CacheLayout, tokens: torch.Tensor) -> int:
        """Before a prompt pass over `tokens` [B, q] on `layout` (empty, dynamic): write the cached prefix of every
        row and return the columns c restored (0: none); the caller feeds `tokens[:, c:]`."""
        if layout.length != 0 or layout.name != "dynamic":
            return 0
        cache, pads = self.scope.cache, layout.padding.host
        rows = [tokens[b, pads[b] :].tolist() for b in range(tokens.shape[0])]
        matches = [cache.match(row, self.scope.salt, limit=len(row) - 1) for row in rows]
        columns = min(pad + match.length for pad, match in zip(pads, matches))
        reused = [max(0, columns - pad) for pad in pads]  # nothing where every column before c is padding
        restored = any(reused) and _append(layout.cache, matches, reused, pads, columns, tokens.shape[1])
        cache.record(sum(len(row) for row in rows), sum(reused) if restored else 0)
        if not restored:
            return 0
        layout.advance(columns)
        self.reused += sum(reused)
        return columns

    def store_prompts(self, layout: CacheLayout, tokens: torch.Tensor) -> None:
        """After a prompt pass over `tokens` [B, q]: every row's prompt (from its padding on) into the cache."""
        for b, pad in enumerate(layout.padding.host):
            self._store(layout, b, tokens[b, pad:].tolist(), pad)

    def keep_finished(self, slots: Slots, slot: int, end: int) -> None:
        """Row `slot` ended with its newest committed token at column `end` − 1: its committed tokens but that one
        (the target's cache holds their keys; nothing after them is read) into the cache."""
        pad = slots.padding.host[slot]
        end = min(end - 1, self.layout.length)
        if end > pad:
            self._store(self.layout, slot, slots.ids[slot, pad:end].tolist(), pad)

    def _store(self, layout: CacheLayout, slot: int, tokens: list[int], pad: int) -> None:
        layers = hf_compat.cache_tensors(layout.cache)

        def read(begin: int, end: int) -> torch.Tensor:  # [layers, 2, H_kv, end − begin, D_h], a copy
            columns = slice(pad + begin, pad + end)
            first = layers[0][0][slot, :, columns]
            block = torch.empty(len(layers), 2, *first.shape, dtype=first.dtype)
            with torch.inference_mode():
                for layer, (keys, values) in enumerate(layers):
                    block[layer, 0].copy_(keys[slot, :, columns])
                    block[layer, 1].copy_(values[slot, :, columns])
            return block

        self.scope.cache.store(tokens, read, self.scope.salt)


def _append(cache, matches: list[PrefixMatch], counts: list[int], pads: list[int], columns: int, width: int) -> bool:
    """Write positions [0, `columns`) of an empty `cache` that will hold `width`: row b's first `counts[b]` positions
    of `matches[b]` at columns [pads[b], columns), zeros elsewhere (masked padding). False, with nothing written, for
    a cache kind it cannot fill."""
    layers, _, heads, size, head_dim = next(match.blocks[0].shape for match in matches if match.length)
    dtype = next(match.blocks[0].dtype for match in matches if match.length)
    native = hasattr(cache, "reserve")  # the native decoder's cache (`native.decoder_cache.NativeCache`)
    if not native and not isinstance(cache, DynamicCache):
        return False
    with torch.inference_mode():
        if native:  # room for the whole pass at once, then its layers' views over [0, columns) written in place
            cache.reserve(len(matches), width)
            cache.length = columns
            into = [(view.keys, view.values) for view in cache.layers]
        else:
            into = [tuple(torch.zeros(len(matches), heads, columns, head_dim, dtype=dtype) for _ in "kv")
                    for _ in range(layers)]  # fmt: skip
        for b, (match, count, pad) in enumerate(zip(matches, counts, pads)):
            for index, block in enumerate(match.blocks[: -(-count // size)]):
                begin = index * size
                n = min(size, count - begin)
                for layer, (keys, values) in enumerate(into):
                    keys[b, :, pad + begin : pad + begin + n].copy_(block[layer, 0, :, :n])
                    values[b, :, pad + begin : pad + begin + n].copy_(block[layer, 1, :, :n])
        if not native:
            for layer, (keys, values) in enumerate(into):
                cache.update(keys, values, layer)
    return True

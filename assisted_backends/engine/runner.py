"""The runner: one causal LM, its KV cache layout, and the one forward call the loop needs.

`Runner` is the interface the engine types against (`engine.round`, `engine.state`, `engine.joins`): what any model
implementation must offer to be a target, whether transformers' modeling stepped eagerly, a graph-captured step or
the native decoder, without the engine knowing which. `ModelRunner` is the package's one implementation, over any
`CausalModel`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from assisted_backends import hf_compat
from assisted_backends.engine import cache_surgery
from assisted_backends.engine.head_on_demand import OnDemandHead
from assisted_backends.engine.kv_cache import CacheLayout, make_layout
from assisted_backends.engine.realign import RowMove
from assisted_backends.engine.row_pass import RowPass
from assisted_backends.engine.slots import RowPadding, Slots
from assisted_backends.engine.token_tree import MASK_IMPLEMENTATIONS, TokenTree, attention_mask

if TYPE_CHECKING:  # a call without a prefix cache imports none of it
    from assisted_backends.engine.prefix_reuse import PrefixReuse


class CausalModel(Protocol):
    """What a runner drives, whichever implementation computes it: transformers' modeling (the reference, on the
    package's kernels or not) or the native decoder (`native.decoder_model.NativeCausalLM`).

    - `forward(input_ids [B, q], attention_mask [B, T] | None, position_ids [B, q], past_key_values, cache_position
      [q], logits_to_keep)` writes the q new positions at `cache_position` and returns an object with `.logits`
      [B, q or logits_to_keep, V]; the positions are the runner's (left padding, rollback), never the model's own.
    - The cache comes from `hf_compat.new_dynamic_cache` / `new_static_cache` (a model with `new_native_cache`
      makes its own) and keeps every position until rolled back: `crop` / a write position set back, rows moved
      or written through its per-layer `keys` / `values` [B, H_kv, T, D] (`engine.cache_surgery`).
    """

    config: Any

    def __call__(self, *, input_ids: torch.Tensor, **kwargs: Any) -> Any: ...


class FeatureTap(Protocol):
    """A drafter reading the target's hidden states (`drafters.eagle.features.FeatureStore`): around every forward
    of the target, `capture(start)` keeps the features of the positions fed from column `start`; around a queue's
    one-row pass over a joining prompt, `capture_row(slot, start)` keeps them in the row at `slot` alone."""

    def capture(self, start: int) -> Any: ...

    def capture_row(self, slot: int, start: int) -> Any: ...


@runtime_checkable
class Runner(Protocol):
    """What the engine asks of a target's runner (`tests/project/test_round_protocol.py` holds this list).

    - `length`: positions its cache holds (left padding included); `forward_count`: passes so far;
      `resizable`: rows may leave or join the batch (a dynamic cache; a static one keeps its batch size);
      `head`: the output head on demand (`engine.head_on_demand`), or None where the model offers none.
    - `forward(tokens [B, q], last_only, hidden_only)`: feed `tokens` after the cached positions; float logits
      [B, q or 1, V], or with `hidden_only` the head's inputs [B, q, D].
    - `forward_tree(tokens [1, N + 1], tree)`, `keep_path(begin, queries)`, `tree_refusal()`: token trees.
    - `rollback(length)`: forget positions from `length` on. `move_rows(move, length)`: batches, the rows moved
      (their padding is the slots', moved first). `row_pass(...)`, `insert_row(...)`: queues, a prompt's own
      pass (`engine.row_pass`, whole or in chunks), then its row written at a slot.
    - `tap_features(tap)`: a drafter reads the hidden states of every forward from now on (steps eagerly).
    """

    length: int
    forward_count: int
    resizable: bool
    head: OnDemandHead | None

    def forward(self, tokens: torch.Tensor, last_only: bool = False, hidden_only: bool = False) -> torch.Tensor: ...

    def forward_tree(self, tokens: torch.Tensor, tree: TokenTree) -> torch.Tensor: ...

    def keep_path(self, begin: int, queries: list[int]) -> None: ...

    def tree_refusal(self) -> str | None: ...

    def rollback(self, length: int) -> None: ...

    def move_rows(self, move: RowMove, length: int) -> None: ...

    def row_pass(self, prompt: torch.Tensor, width: int, pad_id: int) -> RowPass: ...

    def insert_row(self, slot: int, row: RowPass, begin: int, keep: int) -> torch.Tensor: ...

    def tap_features(self, tap: FeatureTap) -> None: ...


class ModelRunner:
    """Feeds new tokens to a model on top of its cache and returns the logits (the `Runner` protocol).

    Position ids are computed here, not by the model, so left padding and rollback never confuse
    a model's own position bookkeeping. Positions of tokens beyond the model's range (only ever
    fixed-shape filler past the last token that can be committed) are clamped; causality keeps
    them from touching any committed position.

    `head_on_demand`: the loop may ask for the head's inputs instead of logits (`engine.head_on_demand`),
    once the first prefill showed that applying the head itself reproduces the model's logits.
    `position_limit`: the positions the model can encode (None: no clamping);
    `inputs_from`: the slots whose per-column forward inputs (`token_type_ids`, caller-given
    `position_ids`) go with the fed columns; `eager`: the model a backend wrapped (a graph-captured step), stepped
    instead once a drafter taps the hidden states (None: `model` itself runs eagerly).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        layout: CacheLayout,
        step_boundary: Callable[[], None] = lambda: None,
        head_on_demand: bool = False,
        position_limit: int | None = None,
        inputs_from: Slots | None = None,
        eager: PreTrainedModel | None = None,
    ) -> None:
        self.layout = layout
        self.step_boundary = step_boundary
        self.forward_count = 0
        self.position_limit = position_limit
        self._max_position = position_limit - 1 if position_limit else None
        self.inputs_from = inputs_from
        self._eager = eager
        self._bind(model)
        self.head = OnDemandHead.of(model) if head_on_demand else None
        self.tree_passes = 0  # token-tree verify passes (`forward_tree`)
        self.feature_tap: FeatureTap | None = None  # set by `tap_features`
        self.prefix: PrefixReuse | None = None  # prompt passes reuse earlier prefixes (`engine.prefix_reuse`)

    def run_eagerly(self) -> None:
        """Step the model the backend wrapped (`eager`) directly, with the same cache: for drafters that read hidden
        states with forward hooks, which a graph replay does not run."""
        if self._eager is not None:
            self._bind(self._eager)

    def tap_features(self, tap: FeatureTap) -> None:
        """From now on every forward runs inside `tap.capture(start)` (a drafter reading the target's hidden
        states, `drafters.eagle`), eagerly; token trees are refused (such a drafter sees chains only)."""
        self.run_eagerly()
        self.feature_tap = tap

    @property
    def resizable(self) -> bool:
        """Whether rows may leave or join the batch: a dynamic cache (a static one keeps its batch size)."""
        return self.layout.name == "dynamic"

    def _bind(self, model: PreTrainedModel) -> None:
        """Step `model`, with what its forward accepts read once."""
        self.model = model
        self._pass_cache_position = hf_compat.forward_accepts(model, "cache_position")
        self._keep_last = hf_compat.logits_to_keep_kwargs(model, 1)

    @property
    def length(self) -> int:
        return self.layout.length

    def forward(self, tokens: torch.Tensor, last_only: bool = False, hidden_only: bool = False) -> torch.Tensor:
        """Feed `tokens` [B, q] after the cached positions; return float logits [B, q or 1, V], or with
        `hidden_only` the head's inputs [B, q, D] (the head is skipped: `head.logits` applies it). A prompt pass
        (`last_only` on an empty cache) with a prefix cache feeds only what it does not restore
        (`engine.prefix_reuse`), and stores the prompts afterwards."""
        reuse = self._prefix_reuse(last_only)
        prompt = tokens
        if reuse is not None:
            tokens = tokens[:, reuse.restore(self.layout, tokens) :]
        query_length = tokens.shape[1]
        start = self.layout.length
        cache_position = torch.arange(start, start + query_length, device=tokens.device)  # [q]
        position_ids = cache_position[None, :] - self.layout.pad[:, None]  # [B, q]
        position_ids = position_ids.clamp(min=0, max=self._max_position)
        kwargs = dict(self._keep_last) if last_only else {}
        if self.inputs_from is not None:
            given = self.inputs_from.column_inputs(start, start + query_length)
            position_ids = given.pop("position_ids", position_ids)
            kwargs.update(given)
        if self._pass_cache_position:
            kwargs["cache_position"] = cache_position
        mask = self.layout.attention_mask(query_length)
        holes = (
            self.inputs_from.holes(mask.shape[1] if mask is not None else start + query_length)
            if self.inputs_from
            else None
        )
        if holes is not None:  # masked columns inside rows, as well as each row's left padding
            mask = holes if mask is None else mask * holes
        cache, mask = hf_compat.model_inputs(self.layout.cache, mask, query_length)
        checking = last_only and self.head is not None and self.head.checked() is None
        capture = self.head.capture(skip=hidden_only) if (hidden_only or checking) else nullcontext()
        features = self.feature_tap.capture(start) if self.feature_tap is not None else nullcontext()
        with torch.inference_mode(), capture, features:
            output = self.model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=True,
                **hf_compat.cache_kwargs(self.model, cache),
                **kwargs,
            )
        hf_compat.keep_returned_cache(self.layout.cache, output)
        self.layout.advance(query_length)
        self.forward_count += 1
        self.step_boundary()
        if reuse is not None:
            reuse.store_prompts(self.layout, prompt)
        if hidden_only:
            return self.head.captured
        logits = output.logits
        if last_only:
            logits = logits[:, -1:, :]
        if checking:
            self.head.check(logits)
        return logits.float()

    def _prefix_reuse(self, last_only: bool) -> PrefixReuse | None:
        """The prefix cache a prompt pass reuses: one is set, the cache is empty, and no drafter reads every position's
        hidden states, no per-column input changes the keys (else None: the pass runs as it would without)."""
        if self.prefix is None or not last_only or self.layout.length != 0:
            return None
        return self.prefix if self.feature_tap is None and self.inputs_from is None else None

    def tree_refusal(self) -> str | None:
        """Why this runner cannot verify a token tree (None: it can): trees need one row, a dynamic cache of plain
        layers (no window dropping positions, no tuple cache), and an attention that takes a 4-D mask."""
        if self.layout.name != "dynamic" or len(self.layout.padding.host) != 1 or self.layout.padding.any():
            return "a token tree needs one row in a dynamic cache"
        if self.feature_tap is not None:
            return "a drafter reading the target's hidden states (EAGLE) sees chains only"
        if self.inputs_from is not None:
            return "a token tree cannot carry per-column inputs"
        layers = getattr(self.layout.cache, "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            return "a token tree needs every cache layer to keep all positions"
        model = self._tree_model
        config = getattr(model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        if getattr(text, "model_type", None) in ("bloom", "mpt") or getattr(text, "alibi", False):
            return "a token tree needs positions from position ids (ALiBi biases by cache index)"
        windowed = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True)
        if (
            windowed
            or getattr(text, "attention_chunk_size", None)
            or "sliding_attention" in (getattr(text, "layer_types", None) or ())
        ):
            return "a token tree's mask has no sliding window or chunks"
        implementation = getattr(config, "_attn_implementation", None)
        if implementation not in MASK_IMPLEMENTATIONS or not isinstance(model, PreTrainedModel):
            return f"a token tree needs a 4-D mask, which attention {implementation!r} is not given here"
        return None

    @property
    def _tree_model(self) -> Any:
        """The model a tree pass calls: the one a backend wrapped (`eager`, a graph-captured step) where there is one; a
        tree runs on a dynamic cache, which such a wrapper steps eagerly anyway."""
        return self._eager if self._eager is not None else self.model

    def forward_tree(self, tokens: torch.Tensor, tree: TokenTree) -> torch.Tensor:
        """Token trees (`engine.token_tree`): feed `tokens` [1, N + 1] (the pending token, then the tree's nodes)
        after the cached positions, query r at position length + depth(r), seeing the prefix and its ancestors only;
        float logits [1, N + 1, V]. The cache then holds all N + 1 queries (`keep_path` keeps one path)."""
        start = self.layout.length
        queries = tokens.shape[1]
        cache_position = torch.arange(start, start + queries, device=tokens.device)  # [N + 1]
        depths = torch.tensor(tree.depths(), device=tokens.device)
        position_ids = (start + depths)[None, :].clamp(min=0, max=self._max_position)  # [1, N + 1]
        model = self._tree_model
        implementation = model.config._attn_implementation
        dtype = hf_compat.activation_dtype(model)
        mask = attention_mask(tree, start, implementation, dtype).to(tokens.device)
        kwargs = {"cache_position": cache_position} if self._pass_cache_position else {}
        with torch.inference_mode():
            output = model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=True,
                **hf_compat.cache_kwargs(model, self.layout.cache),
                **kwargs,
            )
        self.layout.advance(queries)
        self.forward_count += 1
        self.tree_passes += 1
        self.step_boundary()
        return output.logits.float()

    def keep_path(self, begin: int, queries: list[int]) -> None:
        """After a tree pass that began at position `begin` (its root): keep the root and the tree's `queries`
        (ascending) at consecutive positions [begin, begin + 1 + len(queries)); the rest is rolled back."""
        cache_surgery.keep_cache_positions(self.layout.cache, begin + 1, [begin + query for query in queries])
        self.layout.rollback(begin + 1 + len(queries))

    def extend_from(self, source: ModelRunner, layers: int, end: int) -> bool:
        """Take positions [length, end) of the first `layers` layers from `source`'s cache instead of computing
        them (an early-exit view: the same weights computed them). False, with nothing changed, where a
        layout cannot (static layouts, tuple caches): the caller feeds those tokens instead."""
        if self.layout.name != "dynamic" or source.layout.name != "dynamic" or end > source.length:
            return False
        if not cache_surgery.copy_cache_positions(source.layout.cache, self.layout.cache, layers, self.length, end):
            return False
        self.layout.advance(max(0, end - self.length))
        return True

    def rollback(self, length: int) -> None:
        self.layout.rollback(length)

    def row_pass(self, prompt: torch.Tensor, width: int, pad_id: int) -> RowPass:
        """Queues (`engine.joins`): the pass of a joining prompt `prompt` [P] alone, left-padded to `width` columns (a
        prompt bucket under static shapes, else P), on a one-row cache of this runner's layout kind; it reuses and
        fills the call's prefix cache where this runner's prompt passes do, and may be fed in chunks, but not under a
        feature tap (the tap captures every position's features in one pass) or static shapes."""
        length = prompt.shape[0]
        scratch = ModelRunner(
            self.model, self.layout.one_row(self.model, width - length, width), self.step_boundary,
            position_limit=self.position_limit,
        )  # fmt: skip
        untapped = self.feature_tap is None
        return RowPass(scratch, prompt, width, pad_id, self.prefix if untapped else None,
                       chunkable=untapped and self.layout.name == "dynamic")  # fmt: skip

    def insert_row(self, slot: int, row: RowPass, begin: int, keep: int) -> torch.Tensor:
        """Queues: the row at `slot` now holds `row`'s prompt at columns [begin, begin + P). What is left of the
        pass is fed; its first `keep` positions' keys and values (keep <= P: what this cache holds of the row, the
        rest stays pending) are written into the row. Returns the logits of the prompt's last position [1, 1, V]
        (what `model.generate` on that prompt alone computes first). A tapped runner hands the pass's features to
        the row (`FeatureTap.capture_row`; its passes are never chunked)."""
        tap, padding = self.feature_tap, row.width - row.length
        with tap.capture_row(slot, begin - padding) if tap is not None else nullcontext():
            if row.logits is None:
                row.feed()
        self.forward_count += row.scratch.forward_count
        self.layout.set_row_pad(slot, begin)
        self.layout.write_row(slot, row.scratch.layout, begin, padding, keep)
        return row.logits

    def copy_row_from(self, source: ModelRunner, slot: int, pad: int, count: int, layers: int) -> None:
        """Queues: the row at `slot` has a new occupant with `pad` columns of left padding; its positions
        [pad, pad + count) of the first `layers` layers are taken from the same row of `source`'s cache (an
        early-exit view: the target computed them with the same weights)."""
        self.layout.set_row_pad(slot, pad)
        self.layout.write_row(slot, source.layout, pad, pad, count, layers, source_row=slot)

    def move_rows(self, move: RowMove, length: int) -> None:
        """Batches: shift each row's cached positions (`engine.realign`); keep at most `length`. The rows' padding is
        the slots' (`RowPadding`), which moved first."""
        self.layout.move_rows(move, length)


@dataclass(frozen=True)
class RunnerBuilder:
    """The runners of one call (`api.run` makes it, `drafters.factory` calls it for a draft): over the slots'
    rows (reading its `padding`) or some of them (`rows`: a padding of their own), a cache layout of the plan's kind
    (`layout`, `capacity`, `bucket`), the backend's `step_boundary`, and `eager_of(model)`: the model a backend's
    wrapper stepped, for a runner whose hidden states a drafter taps (`ModelRunner.tap_features`)."""

    layout: str
    capacity: int
    bucket: int
    padding: RowPadding
    step_boundary: Callable[[], None] = lambda: None
    eager_of: Callable[[PreTrainedModel], PreTrainedModel] | None = None

    def __call__(
        self,
        model: PreTrainedModel,
        rows: list[int] | None = None,
        head_on_demand: bool = False,
        limit: int | None = None,
        inputs: Slots | None = None,
    ) -> ModelRunner:
        """A runner for `model`: `head_on_demand` as the plan decided, `limit` its positions, `inputs` the slots
        whose per-column inputs go with the fed columns."""
        padding = self.padding
        if rows is not None:
            padding = torch.tensor([padding.host[b] for b in rows], device=padding.device)
        layout = make_layout(self.layout, model, padding, self.capacity, self.bucket)
        eager = self.eager_of(model) if self.eager_of is not None else None
        return ModelRunner(model, layout, self.step_boundary, head_on_demand, limit, inputs, eager)

"""`NativeCausalLM`: a `.gguf` model's whole forward pass in one call into C++ (`native/decoder/decoder.cpp`).

It reads the weights a loaded quantized model already holds (the kernels' block tensors, norms, the rotary table
its own rotary module computes) and hands them to the native `Decoder` once; each forward (a prefill chunk, a
decode step, a verify pass over γ + 1 rows, a batch of rows) is then one call that runs every layer, the final
norm and the head for the rows asked for. The engine drives it as it drives any causal LM (`engine.runner`'s
`CausalModel` protocol): `forward(input_ids, attention_mask, position_ids, past_key_values, cache_position,
logits_to_keep)`, with a `NativeCache` (`native.decoder_cache`) its layouts crop, roll back and move rows of.

Exactness: every op computes a row alone in a fixed order (docs/native.md), so a verify pass over M rows gives
M one-token steps' logits bit for bit. Against transformers' modeling on the same kernels (the `reference` it
wraps, still the path for everything it does not cover) it differs in the last bits of the norms' sums and
SiLU's exp only.

Hidden states: `capturing_hidden_states(layers)` makes each forward within it hand out, from the same native call,
the residual stream entering the layers asked for (L: the last layer's output), as forward hooks on the decoder
layers read it on transformers' modeling; an EAGLE head's feature tap (`drafters.eagle.features.LayerTap`) reads
them so. Hooks on the reference's layers do not run on the native step: a forward with some on raises.

`why_not_native(model)` (`native.decoder_coverage`) says why a model is not covered (None: it is); `native_model(model)`
wraps a covered one. Nothing here imports quantized/: its layers are read by what they hold (`decoder_coverage`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from assisted_backends.native import decoder_build, extension
from assisted_backends.native.decoder_cache import NativeCache
from assisted_backends.native.decoder_cache import kv_cache_dtype as kv_cache_dtype_of
from assisted_backends.native.decoder_coverage import (
    FAMILIES,
    BlockLayer,
    mlp_norm,
    native_embedding,
    projections,
    text_config,
    two_tables,
    why_not_native,
    window,
)
from assisted_backends.native.heap import trim_heap

STEP_LINE = "forward pass: the native decoder (one call into C++ a step, batch-invariant)"
# rows from which a forward hands the heap pages its temporaries touched back to the system afterwards (a prefill
# chunk: glibc keeps them otherwise, 10-15 MiB on SmolLM2-135M after 32 rows; decode steps and verify passes reuse
# the same few pages each time and are left alone)
_TRIM_ROWS = 16


@dataclass
class _Output:
    """What the engine reads of a forward: the logits (and the cache, updated in place)."""

    logits: torch.Tensor
    past_key_values: NativeCache


def why_unavailable(model: nn.Module) -> str | None:
    """Why this run keeps transformers' modeling for `model` (the switch, the build, or coverage); None: native."""
    # the switch and the coverage first: an uncovered model never waits for the decoder's build
    return decoder_build.switched_off() or why_not_native(model) or decoder_build.why_unavailable() or None


def native_linear(module, layer: BlockLayer):
    """The decoder module's `Linear` over a block layer's tensors (shared, not copied) and bias."""
    return module.make_linear(*layer.weight_data.kernel_arguments(layer.bias))


class NativeCausalLM(nn.Module):
    """A covered quantized causal LM (`reference`, transformers' modeling on the kernels) stepped in one native call
    per forward. Its float parameters and block tensors are the reference's own (shared, not copied)."""

    _supports_sdpa = True  # the backend's attention switch acts on the reference (`set_attn_implementation`)
    main_input_name = "input_ids"

    def __init__(self, reference: nn.Module, kv_cache_dtype: str = "fp32") -> None:
        super().__init__()
        self.kv_cache_dtype = kv_cache_dtype_of(kv_cache_dtype)  # the caches it makes (`decoder_cache.KV_CACHE_DTYPES`)
        why = why_unavailable(reference)
        if why:
            raise ValueError(f"the native decoder cannot run this model: {why}")
        self.reference = reference
        self.config = reference.config
        self.generation_config = getattr(reference, "generation_config", None)
        self._native = self._build(decoder_build.module(), reference)
        self._rotary_positions = 0
        embedding = reference.get_input_embeddings()
        object.__setattr__(self, "_embed", None if native_embedding(embedding) else embedding)  # not a submodule
        self.quantization_report = getattr(reference, "quantization_report", {})
        self.step_report = STEP_LINE
        self._taps: tuple[list[int], dict[int, torch.Tensor]] | None = None  # (layers, where their states go)

    def __getattr__(self, name: str):
        """What the generation API reads of a causal LM (generation config helpers, flags): the reference's."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            reference = self.__dict__.get("_modules", {}).get("reference")
            if reference is None or name.startswith("__"):
                raise
            return getattr(reference, name)

    def _hooked(self) -> bool:
        """Whether hooks sit on the reference's decoder layers (they would not run on the native step)."""
        return any(layer._forward_pre_hooks or layer._forward_hooks for layer in self.reference.model.layers)

    @contextmanager
    def capturing_hidden_states(self, layers: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
        """Within the block, each forward puts into the yielded dict {k: [B, M, D]} the residual stream entering
        decoder layer k (k = L: the last layer's output, before the final norm) of every row it feeds, computed by
        the same native call (what hooks on the decoder layers capture on transformers' modeling)."""
        depth = len(self.reference.model.layers)
        wanted = sorted({int(k) for k in layers})
        if any(not 0 <= k <= depth for k in wanted):
            raise ValueError(f"layers {list(layers)}: hidden states exist for layers 0..{depth} of this model")
        if self._taps is not None:
            raise RuntimeError("capturing_hidden_states: already capturing (one capture at a time)")
        captured: dict[int, torch.Tensor] = {}
        self._taps = (wanted, captured)
        try:
            yield captured
        finally:
            self._taps = None

    def set_attn_implementation(self, name: str) -> None:
        """The reference's attention (what runs where the native decoder does not); the native step's own attention
        is batch-invariant always."""
        setter = getattr(self.reference, "set_attn_implementation", None)
        if callable(setter):
            setter(name)
        else:
            self.reference.config._attn_implementation = name

    @staticmethod
    def _build(module, reference: nn.Module):
        config, inner = text_config(reference), reference.model
        activation, one_plus, _ = FAMILIES[config.model_type]
        first = inner.layers[0].self_attn
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

        def norm(module_or_none) -> torch.Tensor | None:
            """A norm's multiplier: w, or 1 + w where the family's norm scales by it (computed as its forward does)."""
            if module_or_none is None:
                return None
            weight = module_or_none.weight.detach().float()
            return (1.0 + weight if one_plus else weight).contiguous()

        table, embed_scale = module.no_linear(), 0.0  # the rows come from the embedding module unless read natively
        if native_embedding(reference.get_input_embeddings()):
            embedding = reference.get_input_embeddings()
            table = module.make_linear(*embedding.weight_data.kernel_arguments(None))  # its block tensors, shared
            embed_scale = 0.0 if embedding.embed_scale is None else float(embedding.embed_scale)  # fp32: exact
        native = module.Decoder(
            config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
            config.intermediate_size, float(getattr(inner.norm, "variance_epsilon", getattr(inner.norm, "eps", 1e-6))),
            float(first.scaling), norm(inner.norm), table, embed_scale,
            native_linear(module, reference.get_output_embeddings()), activation,
        )  # fmt: skip
        types = getattr(config, "layer_types", None)
        for index, layer in enumerate(inner.layers):
            attention, mlp = layer.self_attn, layer.mlp
            gemma_style = hasattr(layer, "pre_feedforward_layernorm")
            native.add_layer(
                [native_linear(module, w) for w in projections(attention, ("q_proj", "k_proj", "v_proj"))],
                native_linear(module, attention.o_proj),
                [native_linear(module, w) for w in projections(mlp, ("gate_proj", "up_proj"))],
                native_linear(module, mlp.down_proj),
                norm(layer.input_layernorm),
                norm(layer.post_attention_layernorm) if gemma_style else None,
                norm(mlp_norm(layer)),
                norm(getattr(layer, "post_feedforward_layernorm", None)),
                norm(getattr(attention, "q_norm", None)),
                norm(getattr(attention, "k_norm", None)),
                window(reference, attention),
                1 if two_tables(reference) and types and types[index] == "sliding_attention" else 0,
            )
        return native

    # -- what the engine and hf_compat read ---------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def get_input_embeddings(self) -> nn.Module:
        return self.reference.get_input_embeddings()

    def get_output_embeddings(self) -> None:
        return None  # no module computes the head's input here: the engine's head-on-demand stays off

    def new_native_cache(self, batch: int | None = None, capacity: int = 0) -> NativeCache:
        """An empty cache for this model (`hf_compat.new_dynamic_cache` / `new_static_cache` call it)."""
        config = text_config(self)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return NativeCache(config.num_hidden_layers, config.num_key_value_heads, head_dim, batch, capacity,
                           self.kv_cache_dtype)  # fmt: skip

    def _ensure_rotary(self, end: int) -> None:
        """The rotary table [P, Dh] up to position `end` (computed by the model's own rotary module, grown by
        doubling up to the model's range)."""
        if end <= self._rotary_positions:
            return
        limit = getattr(text_config(self), "max_position_embeddings", None) or end
        size = min(max(end, 2 * self._rotary_positions, 1024), max(limit, end))
        positions = torch.arange(size)[None]
        rotary, dummy = self.reference.model.rotary_emb, torch.zeros(1, dtype=torch.float32)
        with torch.inference_mode():
            if two_tables(self.reference):  # Gemma 3: full-attention and sliding layers rotate by different bases
                for table, kind in enumerate(("full_attention", "sliding_attention")):
                    cos, sin = rotary(dummy, positions, kind)
                    self._native.set_rotary(table, cos[0].float().contiguous(), sin[0].float().contiguous())
            else:
                cos, sin = rotary(dummy, positions)
                self._native.set_rotary(0, cos[0].float().contiguous(), sin[0].float().contiguous())
        self._rotary_positions = size

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: NativeCache | None = None,
        cache_position: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        use_cache: bool = True,
        **unused,
    ) -> _Output:
        """Logits [B, keep or M, V] of `input_ids` [B, M] written at cache positions `cache_position` (default: after
        what `past_key_values` holds)."""
        if unused.get("inputs_embeds") is not None:
            raise ValueError(
                "inputs_embeds: the native decoder takes input_ids; load with ASSISTED_BACKENDS_NATIVE=off"
            )
        cache = past_key_values if past_key_values is not None else self.new_native_cache()
        if not isinstance(cache, NativeCache):
            raise TypeError(f"past_key_values: the native decoder needs its own cache (new_native_cache), not "
                            f"{type(cache).__name__}")  # fmt: skip
        batch, rows = input_ids.shape
        start = int(cache_position[0]) if cache_position is not None else cache.length
        if self._hooked():
            raise RuntimeError(
                "hooks on the reference's decoder layers do not run on the native decoder step: read hidden states "
                "with capturing_hidden_states(layers), or load with ASSISTED_BACKENDS_NATIVE=off"
            )
        if position_ids is None:
            position_ids = torch.arange(start, start + rows)[None].expand(batch, rows)
        cache.reserve(batch, start + rows)
        self._ensure_rotary(int(position_ids.max()) + 1)
        mask = self._row_mask(attention_mask, cache.capacity)
        tap_layers, taps = [], None
        if self._taps is not None:
            tap_layers = self._taps[0]
            taps = torch.empty(len(tap_layers), batch, rows, text_config(self).hidden_size)
        logits = self._native.step(
            input_ids, position_ids, start, cache.keys, cache.values, mask, int(logits_to_keep or 0),
            extension.forced_isa(), None if self._embed is None else self._embed(input_ids).float(), tap_layers, taps,
        )  # fmt: skip
        cache.length = start + rows
        if batch * rows >= _TRIM_ROWS:
            trim_heap()
        if taps is not None:
            self._taps[1].update(zip(tap_layers, taps.unbind(0)))
        return _Output(logits, cache)

    @staticmethod
    def _row_mask(attention_mask: torch.Tensor | None, capacity: int) -> torch.Tensor | None:
        """[B, 1, 1, C] bool of the columns each row may attend (None: all; causality is the kernel's lengths)."""
        if attention_mask is None:
            return None
        mask = attention_mask.bool()
        if bool(mask.all()):
            return None
        width = mask.shape[1]
        if width < capacity:
            mask = torch.nn.functional.pad(mask, (0, capacity - width), value=True)
        return mask[:, :capacity].reshape(mask.shape[0], 1, 1, capacity).contiguous()


def native_model(model: nn.Module, kv_cache_dtype: str = "fp32") -> nn.Module:
    """`model` stepped natively where it is covered and the switch allows, its cache stored as `kv_cache_dtype`
    names; else `model` itself, its `step_report` saying why not. A model already stepped natively comes back as
    it is."""
    kv_cache_dtype_of(kv_cache_dtype)
    if isinstance(model, NativeCausalLM):
        return model
    why = why_unavailable(model)
    if why is None:
        return NativeCausalLM(model, kv_cache_dtype)
    model.step_report = f"forward pass: transformers' modeling on the kernels ({why})"
    return model


def keep_cache_as(model: nn.Module, kv_cache_dtype: str) -> None:
    """The caches `model` makes from now on keep keys and values in `kv_cache_dtype` (`--kv-cache-dtype`); a model
    not on the native step (which alone keeps its own cache) is one ValueError naming why."""
    dtype = kv_cache_dtype_of(kv_cache_dtype)
    if not isinstance(model, NativeCausalLM):
        why = getattr(model, "step_report", "not a .gguf target")
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype}: only the native decoder step of a .gguf target "
                         f"keeps its cache in another type, and this target runs otherwise ({why}); drop the "
                         "flag")  # fmt: skip
    model.kv_cache_dtype = dtype

"""`NativeCausalLM`: a `.gguf` model's whole forward pass in one call into C++ (`native/decoder/decoder.cpp`).

It reads the weights a loaded quantized model already holds (the kernels' block tensors, norms, the rotary table
its own rotary module computes) and hands them to the native `Decoder` once; each forward (a prefill chunk, a
decode step, a verify pass over γ + 1 rows, a batch of rows) is then one call that runs every layer, the final
norm and the head for the rows asked for. The engine drives it as it drives any causal LM (`engine.runner`'s
`CausalModel` protocol): `forward(input_ids, attention_mask, position_ids, past_key_values, cache_position,
logits_to_keep)`, with a `NativeCache` its layouts crop, roll back and move rows of.

Exactness: every op computes a row alone in a fixed order (docs/native.md), so a verify pass over M rows gives
M one-token steps' logits bit for bit. Against transformers' modeling on the same kernels (the `reference` it
wraps, still the path for everything it does not cover) it differs in the last bits of the norms' sums and
SiLU's exp only.

Hidden states: `capturing_hidden_states(layers)` makes each forward within it hand out, from the same native call,
the residual stream entering the layers asked for (L: the last layer's output), as forward hooks on the decoder
layers read it on transformers' modeling; an EAGLE head's feature tap (`drafters.eagle.features.LayerTap`) reads
them so. Hooks on the reference's layers do not run on the native step: a forward with some on raises.

`why_not_native(model)` says why a model is not covered (None: it is); `native_model(model)` wraps a covered one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from assisted_backends.native import decoder_build, extension
from assisted_backends.native.heap import trim_heap
from assisted_backends.quantized.blocks import BlockWeight
from assisted_backends.quantized.fusion import ProjectionSlice
from assisted_backends.quantized.linear import QuantizedEmbedding, QuantizedLinear

# model_type -> (activation code of decoder.cpp, whether norms scale by 1 + w, whether each block's output is normed)
FAMILIES = {"llama": (0, False, False), "mistral": (0, False, False), "qwen2": (0, False, False),
            "qwen3": (0, False, False), "gemma3_text": (1, True, True)}  # fmt: skip
_ACTIVATIONS = {0: ("silu",), 1: ("gelu_pytorch_tanh",)}
STEP_LINE = "forward pass: the native decoder (one call into C++ a step, batch-invariant)"
_GROWTH = 64  # the fewest positions a dynamic cache holds; it doubles from there (memory follows the length used)
# rows from which a forward hands the heap pages its temporaries touched back to the system afterwards (a prefill
# chunk: glibc keeps them otherwise, 10-15 MiB on SmolLM2-135M after 32 rows; decode steps and verify passes reuse
# the same few pages each time and are left alone)
_TRIM_ROWS = 16


class _LayerView:
    """One layer's keys and values [B, Hkv, length, Dh] as views of the cache's buffers (what `engine.cache_surgery`
    reads and writes through `hf_compat.map_cache_tensors` / `cache_tensors`); assigning one stores it."""

    def __init__(self, cache: NativeCache, index: int) -> None:
        self._cache, self._index = cache, index

    @property
    def keys(self) -> torch.Tensor | None:
        return self._cache.view(self._cache.keys, self._index)

    @keys.setter
    def keys(self, value: torch.Tensor) -> None:
        self._cache.store(self._cache.keys, self._index, value)

    @property
    def values(self) -> torch.Tensor | None:
        return self._cache.view(self._cache.values, self._index)

    @values.setter
    def values(self, value: torch.Tensor) -> None:
        self._cache.store(self._cache.values, self._index, value)


class NativeCache:
    """The native decoder's KV cache: per layer [B, Hkv, C, Dh] fp32, preallocated; `length` positions valid.

    Rollback is setting `length` (`crop`); a forward writes its rows at the positions the engine names
    (`cache_position`) and the stale tail past them is never read. Grows by reallocation (a dynamic layout) when a
    forward needs more than C positions; a static layout's capacity is fixed when made."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, batch: int | None = None, capacity: int = 0) -> None:
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self._length = 0
        self._stored: dict[tuple[int, int], int] = {}  # (buffer kind, layer) -> width, while a row move is under way
        self._views = [_LayerView(self, index) for index in range(layers)]
        self.static_capacity = capacity if batch is not None else None
        if batch is not None:
            self._allocate(batch, max(capacity, 1))

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        self._length = value
        self._stored.clear()

    @property
    def layers(self) -> list:
        """Per layer, its keys and values (`engine.cache_surgery` moves rows through them)."""
        return self._views

    @property
    def batch(self) -> int | None:
        return None if self.keys[0] is None else self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def _allocate(self, batch: int, capacity: int) -> None:
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        for buffers in (self.keys, self.values):
            for index, old in enumerate(buffers):
                new = torch.zeros(shape)
                if old is not None and old.shape[0] == batch:
                    keep = min(old.shape[2], capacity)
                    new[:, :, :keep] = old[:, :, :keep]
                buffers[index] = new

    def reserve(self, batch: int, end: int) -> None:
        """Room for positions [0, end) of `batch` rows (a different batch size starts empty)."""
        if self.batch != batch:
            self._allocate(batch, max(end, _GROWTH))
            self.length = 0
        elif end > self.capacity:
            self._allocate(batch, max(end, 2 * self.capacity))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions (negative: drop that many), as DynamicCache.crop."""
        keep = self.length + max_length if max_length < 0 else max_length
        self.length = max(0, min(self.length, keep))

    def view(self, buffers: list, index: int) -> torch.Tensor | None:
        tensor = buffers[index]
        width = self._stored.get((buffers is self.values, index), self._length)
        return None if tensor is None else tensor[:, :, :width]

    def store(self, buffers: list, index: int, value: torch.Tensor) -> None:
        """A layer's new keys or values [B', Hkv, T, Dh] (rows moved or left): copied into the buffers, which
        are reallocated where B' or T does not fit. `length` becomes T once every layer's keys and values are stored
        (a row move replaces them one tensor at a time, each read at the old length before its turn)."""
        batch, _, width, _ = value.shape
        tensor = buffers[index]
        if tensor is None or tensor.shape[0] != batch or tensor.shape[2] < width:
            tensor = torch.zeros(batch, self.kv_heads, max(width, self.capacity, 1), self.head_dim)
            buffers[index] = tensor
        with torch.inference_mode():
            if value.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr():
                value = value.clone()  # a row move's view of these very buffers: an overlapping copy would smear it
            tensor[:, :, :width].copy_(value)
        self._stored[(buffers is self.values, index)] = width
        if len(self._stored) == 2 * len(self.keys):
            self.length = width


@dataclass
class _Output:
    """What the engine reads of a forward: the logits (and the cache, updated in place)."""

    logits: torch.Tensor
    past_key_values: NativeCache


def _text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _block_linear(layer) -> bool:
    return isinstance(layer, QuantizedLinear) and layer.kernel == "blocks"


def _projections(parent: nn.Module, names: Sequence[str]) -> list[QuantizedLinear] | None:
    """The block layers computing `names` of `parent`: one fused layer (in this order) or one each; None: neither."""
    first = getattr(parent, names[0], None)
    if isinstance(first, ProjectionSlice):
        shared = first.shared
        slices = [getattr(parent, name, None) for name in names]
        in_order = (
            all(isinstance(s, ProjectionSlice) and s.shared is shared for s in slices)
            and [s.start for s in slices] == sorted(s.start for s in slices)
            and slices[0].start == 0
        )
        return [shared.fused] if in_order and _block_linear(shared.fused) else None
    layers = [getattr(parent, name, None) for name in names]
    return layers if all(_block_linear(layer) for layer in layers) else None


def why_not_native(model: nn.Module) -> str | None:
    """Why the native decoder does not run `model` (None: it does): family, options and weights it covers."""
    config = _text_config(model)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"its family ({kind}) is not one the native decoder covers yet ({', '.join(FAMILIES)})"
    activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if activation not in _ACTIVATIONS[FAMILIES[kind][0]]:
        return f"its activation ({activation}) is not the one the native decoder computes for {kind}"
    types = getattr(config, "layer_types", None) or ()
    if any(kind not in ("full_attention", "sliding_attention") for kind in types):
        return "it has layers other than full or sliding-window attention"
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, name, None):
            return f"it soft-caps logits ({name})"
    if getattr(config, "use_bidirectional_attention", False):
        return "its attention is bidirectional"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return f"its rotary scaling ({rope.get('rope_type', rope.get('type'))}) depends on the sequence length"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "its modules are not laid out as a Llama-family model's"
    head = model.get_output_embeddings()
    if not _block_linear(head) or head.bias is not None:
        return "its LM head is not a block-quantized layer"
    for layer in inner.layers:
        attention, mlp = layer.self_attn, layer.mlp
        if not hasattr(layer, "input_layernorm") or _mlp_norm(layer) is None:
            return "its layers' norms are not laid out as a Llama-family layer's"
        if _projections(attention, ("q_proj", "k_proj", "v_proj")) is None or not _block_linear(attention.o_proj):
            return "an attention projection is not on the package's block kernels"
        if _projections(mlp, ("gate_proj", "up_proj")) is None or not _block_linear(mlp.down_proj):
            return "an MLP projection is not on the package's block kernels"
        if (getattr(attention, "q_norm", None) is None) != (getattr(attention, "k_norm", None) is None):
            return "it normalizes only one of q and k"
    return None


def _mlp_norm(layer: nn.Module) -> nn.Module | None:
    """The norm before the MLP: Llama's `post_attention_layernorm`, Gemma 3's `pre_feedforward_layernorm` (whose
    `post_attention_layernorm` norms the attention's output)."""
    return getattr(layer, "pre_feedforward_layernorm", None) or getattr(layer, "post_attention_layernorm", None)


def _window(model: nn.Module, attention: nn.Module) -> int:
    """A layer's sliding window (0: none): the attention module's own, or Mistral's config-wide one."""
    config = _text_config(model)
    window = getattr(attention, "sliding_window", None)
    if window is None and config.model_type == "mistral":
        window = getattr(config, "sliding_window", None)
    return int(window or 0)


def _two_tables(model: nn.Module) -> bool:
    """Whether the model's rotary module keeps a table per layer type (Gemma 3's local and global bases)."""
    import inspect

    return "layer_type" in inspect.signature(model.model.rotary_emb.forward).parameters


def _native_embedding(embedding: nn.Module) -> bool:
    """Whether the native code reads the embedding's rows itself (a block table, scaled by an fp32 factor or not)."""
    return isinstance(embedding, QuantizedEmbedding) and embedding.block_meta is not None


def why_unavailable(model: nn.Module) -> str | None:
    """Why this run keeps transformers' modeling for `model` (the switch, the build, or coverage); None: native."""
    # the switch and the coverage first: an uncovered model never waits for the decoder's build
    return decoder_build.switched_off() or why_not_native(model) or decoder_build.why_unavailable() or None


def _linear(module, layer: QuantizedLinear):
    return module.make_linear(*layer.weight_data.kernel_arguments(layer.bias))


class NativeCausalLM(nn.Module):
    """A covered quantized causal LM (`reference`, transformers' modeling on the kernels) stepped in one native call
    per forward. Its float parameters and block tensors are the reference's own (shared, not copied)."""

    _supports_sdpa = True  # the backend's attention switch acts on the reference (`set_attn_implementation`)
    main_input_name = "input_ids"

    def __init__(self, reference: nn.Module) -> None:
        super().__init__()
        why = why_unavailable(reference)
        if why:
            raise ValueError(f"the native decoder cannot run this model: {why}")
        self.reference = reference
        self.config = reference.config
        self.generation_config = getattr(reference, "generation_config", None)
        self._native = self._build(decoder_build.module(), reference)
        self._rotary_positions = 0
        embedding = reference.get_input_embeddings()
        object.__setattr__(self, "_embed", None if _native_embedding(embedding) else embedding)  # not a submodule
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
        config, inner = _text_config(reference), reference.model
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
        if _native_embedding(reference.get_input_embeddings()):
            embedding = reference.get_input_embeddings()
            tensors = {name.removeprefix("block_"): buffer for name, buffer in embedding.named_buffers(recurse=False)
                       if name.startswith("block_")}  # fmt: skip
            table = module.make_linear(*BlockWeight.from_stored(tensors, embedding.block_meta).kernel_arguments(None))
            embed_scale = 0.0 if embedding.embed_scale is None else float(embedding.embed_scale)  # fp32: exact
        native = module.Decoder(
            config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
            config.intermediate_size, float(getattr(inner.norm, "variance_epsilon", getattr(inner.norm, "eps", 1e-6))),
            float(first.scaling), norm(inner.norm), table, embed_scale,
            _linear(module, reference.get_output_embeddings()), activation,
        )  # fmt: skip
        types = getattr(config, "layer_types", None)
        for index, layer in enumerate(inner.layers):
            attention, mlp = layer.self_attn, layer.mlp
            gemma_style = hasattr(layer, "pre_feedforward_layernorm")
            native.add_layer(
                [_linear(module, w) for w in _projections(attention, ("q_proj", "k_proj", "v_proj"))],
                _linear(module, attention.o_proj),
                [_linear(module, w) for w in _projections(mlp, ("gate_proj", "up_proj"))],
                _linear(module, mlp.down_proj),
                norm(layer.input_layernorm),
                norm(layer.post_attention_layernorm) if gemma_style else None,
                norm(_mlp_norm(layer)),
                norm(getattr(layer, "post_feedforward_layernorm", None)),
                norm(getattr(attention, "q_norm", None)),
                norm(getattr(attention, "k_norm", None)),
                _window(reference, attention),
                1 if _two_tables(reference) and types and types[index] == "sliding_attention" else 0,
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
        config = _text_config(self)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return NativeCache(config.num_hidden_layers, config.num_key_value_heads, head_dim, batch, capacity)

    def _ensure_rotary(self, end: int) -> None:
        """The rotary table [P, Dh] up to position `end` (computed by the model's own rotary module, grown by
        doubling up to the model's range)."""
        if end <= self._rotary_positions:
            return
        limit = getattr(_text_config(self), "max_position_embeddings", None) or end
        size = min(max(end, 2 * self._rotary_positions, 1024), max(limit, end))
        positions = torch.arange(size)[None]
        rotary, dummy = self.reference.model.rotary_emb, torch.zeros(1, dtype=torch.float32)
        with torch.inference_mode():
            if _two_tables(self.reference):  # Gemma 3: full-attention and sliding layers rotate by different bases
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
            taps = torch.empty(len(tap_layers), batch, rows, _text_config(self).hidden_size)
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


def native_model(model: nn.Module) -> nn.Module:
    """`model` stepped natively where it is covered and the switch allows; else `model` itself, its `step_report`
    saying why not. A model already stepped natively comes back as it is."""
    if isinstance(model, NativeCausalLM):
        return model
    why = why_unavailable(model)
    if why is None:
        return NativeCausalLM(model)
    model.step_report = f"forward pass: transformers' modeling on the kernels ({why})"
    return model

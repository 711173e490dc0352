"""Every tensor of a `.gguf` file checked against the model's config before any kernel or native code reads it.

A file from a stranger can say one thing in its metadata and hold another in its tensors: a token table wider than
the model, a projection with rows missing, a norm of the wrong length, head counts that cannot be divided. The
kernels and the native decoder index by the config's sizes, so such a tensor would be read or written out of
bounds. `check_file(header, config)` refuses it first, in one line (`GGUFModelError`) naming the file, the tensor or
key, what the config says and what the file holds. It is called by `hf_config.load_config`, the one place a GGUF
file's config is built, so every route that loads a `.gguf` with its blocks passes through it.

What is checked, for any architecture the quantized loader reads (sizes from the transformers config: hidden_size,
intermediate_size, num_attention_heads, num_key_value_heads, head_dim, num_hidden_layers, vocab_size):
- the config itself: at least one layer, head and key/value head, heads divisible by key/value heads, an even head
  size, a vocabulary, a context length in [1, 2^25]; the metadata's stated head sizes (key_length, value_length)
  agree with each other and the config, the rotary dimension count is at most the head size;
- every tensor: `blk.N` for N below the layer count only; norms and biases (1-D) of a float type, not blocks;
- the tensors of the Llama-layout families (`LLAMA_LAYOUT`: the native decoder's families and their kin): each
  known name's shape from the config (q/k/v/output, gate/up/down, the norms, Qwen3's and Gemma 3's q/k norms,
  biases), and every layer's matrices and norms present; for any other family the token table, the head and the
  final norm, which every decoder has.
The header reader (`gguf_header`) already refused tensors whose data overlap or leave gaps, and rows that are not
whole blocks; the native decoder checks its own arguments too (a direct call with wrong shapes raises).
"""

from __future__ import annotations

import re
from pathlib import Path

from assisted_backends.quantized.gguf_header import GGUFHeader

ADVICE = "the file is damaged or was not made for this architecture: download it again"
MAX_CONTEXT = 1 << 25  # 33.5 M positions: above any published model (Llama 4 Scout: 10 M)
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
# GGUF architectures whose tensors are laid out as a Llama's (`blk.N.attn_q` ... `ffn_down`, the same sizes in every
# layer, q/k norms per head): the native decoder's families and their kin. Not here (their layers differ from one to
# the next, or their norms span all heads): MoE families, llama4, deci, olmo2.
LLAMA_LAYOUT = ("llama", "mistral", "mistral3", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "granite",
                "smollm3")  # fmt: skip
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
# a layer's tensors every Llama-layout family has (q/k/v may come fused as attn_qkv)
_REQUIRED = ("attn_norm.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")


class GGUFModelError(ValueError):
    """A `.gguf` file whose tensors or metadata do not fit the model they describe; one line naming the file, what
    is wrong, and the advice."""

    def __init__(self, path: Path | str, subject: str, problem: str) -> None:
        super().__init__(" ".join(f"{path}: {subject}: {problem}; {ADVICE}".split("\n")))  # one line, always
        self.path, self.subject, self.problem = path, subject, problem


_CONFIG_KEYS = {"D": ("hidden_size", "embedding_length"), "F": ("intermediate_size", "feed_forward_length"),
                "H": ("num_attention_heads", "attention.head_count"),
                "Hkv": ("num_key_value_heads", "attention.head_count_kv"), "Dh": ("head_dim", "attention.key_length"),
                "L": ("num_hidden_layers", "block_count"), "V": ("vocab_size", "vocab_size"),
                "context": ("max_position_embeddings", "context_length")}  # fmt: skip


def _sizes(header: GGUFHeader, config) -> dict[str, int | None]:
    """The sizes the tensors are checked against, from a config or the dict it is built from (None: not given);
    a size that is not a whole number is refused here."""
    if isinstance(config, dict):
        values = config
    else:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        values = {name: getattr(text, name, None) for name, _ in _CONFIG_KEYS.values()}
    sizes: dict[str, int | None] = {}
    for size, (name, key) in _CONFIG_KEYS.items():
        value = values.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise GGUFModelError(header.path, f"{header.architecture}.{key}",
                                 f"{shown(value)} where a whole number ({name}) is expected")  # fmt: skip
        sizes[size] = value
    if sizes["Hkv"] is None:
        sizes["Hkv"] = sizes["H"]
    if sizes["Dh"] is None and sizes["D"] is not None and sizes["H"]:
        sizes["Dh"] = sizes["D"] // sizes["H"]
    return sizes


def shown(value: object) -> str:
    """A metadata value in a message: its type and a short, one-line spelling."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    text = ascii(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


# the kinds of value transformers' config takes from GGUF metadata, by the key's last part (GGUF spec's types)
_WHOLE = ("context_length", "embedding_length", "block_count", "feed_forward_length", "head_count", "head_count_kv",
          "key_length", "value_length", "dimension_count", "vocab_size", "sliding_window", "expert_count",
          "expert_used_count", "original_context_length")  # fmt: skip
_REAL = ("layer_norm_rms_epsilon", "layer_norm_epsilon", "freq_base", "freq_scale", "factor", "logit_scale",
         "attn_logit_softcapping", "final_logit_softcapping", "attn_factor", "residual_scale",
         "embedding_scale")  # fmt: skip


def check_metadata(header: GGUFHeader, renamed: dict[str, str]) -> None:
    """Refuse metadata transformers' config cannot take: a count that is not a whole number >= 0, a real number that
    is not a finite one, a token id that is not an index. `renamed`: GGUF key -> config field, the keys it reads."""
    import math

    for key, field in renamed.items():
        value = header.metadata.get(key)
        if value is None:
            continue
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        last = key.rsplit(".", 1)[-1]
        whole = isinstance(value, int) and not isinstance(value, bool)
        if (last in _WHOLE or last.endswith("_token_id")) and not (whole and value >= 0):
            raise GGUFModelError(header.path, key, f"{shown(value)} where a whole number >= 0 ({field}) is expected")
        real = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if last in _REAL and not (real and (value > 0 or "epsilon" not in last)):
            kind = "a number > 0" if "epsilon" in last else "a finite number"
            raise GGUFModelError(header.path, key, f"{shown(value)} where {kind} ({field}) is expected")


def _key(header: GGUFHeader, name: str) -> object:
    """Metadata `<architecture>.<name>` (None: absent), a one-element array as its value."""
    value = header.metadata.get(f"{header.architecture}.{name}")
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value


def check_config(header: GGUFHeader, config) -> dict[str, int | None]:
    """Refuse a config (or the dict of values it is built from: only the sizes given are checked) that no model can
    be built from or run with (see the module docstring); its sizes."""
    path, arch = header.path, header.architecture
    required = ("block_count", "embedding_length") + (("attention.head_count",) if arch in LLAMA_LAYOUT else ())
    for key in required if isinstance(config, dict) else ():  # what llama.cpp requires of every file of `arch`
        if f"{arch}.{key}" not in header.metadata:
            others = sorted({name.split(".")[0] for name in header.metadata if name.endswith(f".{key}")} - {arch})
            also = f" (the file has it for {', '.join(others)})" if others else ""
            raise GGUFModelError(path, f"{arch}.{key}", f"missing from the metadata{also}")
    sizes = _sizes(header, config)
    D, H, Hkv, Dh, L, V = (sizes[key] for key in ("D", "H", "Hkv", "Dh", "L", "V"))

    def need(ok: bool, key: str, problem: str) -> None:
        if not ok:
            raise GGUFModelError(path, key, problem)

    if L is not None:
        need(L >= 1, f"{arch}.block_count", f"{L} layers (num_hidden_layers); a model has at least one")
    if D is not None:
        need(D >= 1, f"{arch}.embedding_length", f"hidden size {D}; a model has at least one")
    if H is not None:
        need(H >= 1, f"{arch}.attention.head_count", f"{H} attention heads; a model has at least one")
    if Hkv is not None:
        need(Hkv >= 1, f"{arch}.attention.head_count_kv", f"{Hkv} key/value heads; a model has at least one")
    if H is not None and Hkv is not None:
        need(H % Hkv == 0, f"{arch}.attention.head_count_kv",
             f"{H} attention heads do not divide among {Hkv} key/value heads")  # fmt: skip
    stated_k, stated_v = _key(header, "attention.key_length"), _key(header, "attention.value_length")
    if stated_k is not None and stated_v is not None:
        need(stated_k == stated_v, f"{arch}.attention.value_length",
             f"values of {stated_v} per head, keys of {stated_k}; the attention here needs them equal")  # fmt: skip
    if Dh is not None:
        for key, stated in (("attention.key_length", stated_k), ("attention.value_length", stated_v)):
            if stated is not None:
                need(stated == Dh, f"{arch}.{key}", f"the config's head size is {Dh}, the file says {stated}")
        need(Dh >= 2 and Dh % 2 == 0, f"{arch}.attention.key_length",
             f"head size {Dh} (hidden {D} / {H} heads unless stated); rotary embeddings need an even one")  # fmt: skip
    rope = _key(header, "rope.dimension_count")
    head = stated_k if stated_k is not None else (D // H if D is not None and H else None)  # the file's head size
    if rope is not None and head is not None:  # (Llama's config takes its head_dim from the rotary count itself)
        need(isinstance(rope, int) and 0 < rope <= head, f"{arch}.rope.dimension_count",
             f"rotary embeddings over {rope} dimensions of a head of {head}")  # fmt: skip
    tokens = header.array_length("tokenizer.ggml.tokens")
    if tokens is not None:
        need(tokens >= 1, "tokenizer.ggml.tokens", "the vocabulary is empty")
    if V is not None:
        need(V >= 1, "tokenizer.ggml.tokens", f"a vocabulary of {V} tokens (vocab_size); a model needs at least one")
        if tokens is not None:
            need(tokens <= V, "tokenizer.ggml.tokens", f"{tokens} tokens, more than the model's {V} (vocab_size)")
    context = sizes["context"]
    if context is not None:
        need(1 <= context <= MAX_CONTEXT, f"{arch}.context_length",
             f"a context of {context} positions (1 to {MAX_CONTEXT} expected)")  # fmt: skip
    return sizes


def _expected_shapes(sizes: dict[str, int | None]) -> dict[str, tuple[int, ...]]:
    """Shape (torch order: [rows, columns]) of each tensor a Llama-layout file may hold, by name without `blk.N.`."""
    D, F, H, Hkv, Dh, V = (sizes[key] for key in ("D", "F", "H", "Hkv", "Dh", "V"))
    q, kv = H * Dh, Hkv * Dh
    return {"token_embd.weight": (V, D), "output.weight": (V, D), "output_norm.weight": (D,),
            "attn_norm.weight": (D,), "ffn_norm.weight": (D,), "post_attention_norm.weight": (D,),
            "post_ffw_norm.weight": (D,), "attn_post_norm.weight": (D,), "ffn_post_norm.weight": (D,),
            "attn_q.weight": (q, D), "attn_k.weight": (kv, D), "attn_v.weight": (kv, D),
            "attn_qkv.weight": (q + 2 * kv, D), "attn_output.weight": (D, q),
            "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,), "attn_qkv.bias": (q + 2 * kv,),
            "attn_output.bias": (D,), "attn_q_norm.weight": (Dh,), "attn_k_norm.weight": (Dh,),
            "ffn_gate.weight": (F, D), "ffn_up.weight": (F, D), "ffn_down.weight": (D, F)}  # fmt: skip


_GENERAL = ("token_embd.weight", "output.weight", "output_norm.weight")  # every family's, same shapes


def check_tensors(header: GGUFHeader, sizes: dict[str, int | None]) -> None:
    """Refuse a tensor of the wrong shape or type, of a layer the config does not have, or missing from a layer."""
    path, arch = header.path, header.architecture
    layout = arch in LLAMA_LAYOUT
    expected = _expected_shapes(sizes)
    seen: set[tuple[int, str]] = set()
    for name, info in header.tensors.items():
        match = _LAYER.match(name)
        stem = name
        if match is not None:
            layer, stem = int(match.group(1)), match.group(2)
            if layer >= sizes["L"]:
                raise GGUFModelError(path, name, f"the config has {_layers(sizes['L'])} ({arch}.block_count), "
                                                 f"the file has tensors of layer {layer}")  # fmt: skip
            seen.add((layer, stem))
        if any(size == 0 for size in info.shape):
            raise GGUFModelError(path, name, f"an empty tensor {list(info.shape)}")
        if len(info.shape) == 1 and info.kind not in FLOAT_TYPES and stem.endswith((".weight", ".bias")):
            raise GGUFModelError(path, name, f"a norm or bias stored as {info.kind} blocks; "
                                             f"the model reads it as floats ({', '.join(FLOAT_TYPES)})")  # fmt: skip
        want = expected.get(stem) if layout or stem in _GENERAL else None
        if want is not None and tuple(info.shape) != want:
            raise GGUFModelError(path, name, f"the config says {list(want)} ({_described(stem, sizes)}), "
                                             f"the file has {list(info.shape)}")  # fmt: skip
    for name in ("token_embd.weight", "output_norm.weight") if layout else ():
        if name not in header.tensors:
            raise GGUFModelError(path, name, "missing from the file")
    if not layout:
        return
    for layer in range(sizes["L"]):
        fused = (layer, "attn_qkv.weight") in seen
        needed = _REQUIRED + (() if fused else ("attn_q.weight", "attn_k.weight", "attn_v.weight"))
        for stem in needed:
            if (layer, stem) not in seen:
                problem = f"missing from the file (the config has {_layers(sizes['L'])}, {arch}.block_count)"
                raise GGUFModelError(path, f"blk.{layer}.{stem}", problem)


def _layers(count: int | None) -> str:
    return f"{count} layer{'' if count == 1 else 's'}"


def _described(stem: str, sizes: dict[str, int | None]) -> str:
    """The config's sizes behind a tensor's expected shape, in words."""
    D, F, H, Hkv, Dh, V = (sizes[key] for key in ("D", "F", "H", "Hkv", "Dh", "V"))
    if stem.startswith(("token_embd", "output.")):
        return f"vocab_size {V} x hidden_size {D}"
    if "norm" in stem and stem.startswith(("attn_q_norm", "attn_k_norm")):
        return f"head_dim {Dh}"
    if "norm" in stem or stem == "attn_output.bias":
        return f"hidden_size {D}"
    if stem.startswith("ffn_"):
        return f"intermediate_size {F}, hidden_size {D}"
    return f"{H} heads, {Hkv} key/value heads of {Dh}, hidden_size {D}"


def check_file(header: GGUFHeader, config) -> None:
    """Refuse a GGUF file whose config or tensors cannot make the model (`GGUFModelError`, one line). `config`:
    the transformers config built for it (every size known)."""
    sizes = check_config(header, config)
    missing = [name for size, (name, _) in _CONFIG_KEYS.items() if sizes[size] is None and size != "context"]
    if missing:
        raise GGUFModelError(header.path, "config", f"no {', '.join(missing)} in the config built from the file")
    check_tensors(header, sizes)

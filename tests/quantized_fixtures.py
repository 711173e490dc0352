"""GGUF blocks and tiny GGUF files with random weights, for the quantized-weights tests.

`random_blocks(kind, n, k)` gives raw blocks of a [n, k] tensor: gguf.quants.quantize where gguf can
quantize the format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), else random bytes with sane fp16 block scales.
`write_tiny_llama_gguf(path, kinds)` writes a 2-layer Llama (hidden 256, so K-quant super-blocks
fit) whose linear weights and tied embedding are of the GGUF formats `kinds` names (one format, or a
role -> format dict with a "default"), norms F32, with a byte-level tokenizer, laid out as llama.cpp
lays a Llama out (query/key rows interleaved per head).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
TINY = {"hidden": 256, "intermediate": 512, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 272}
Q4_K_M_LIKE = {"default": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "token_embd": "Q8_0"}


def random_blocks(kind: str, n: int, k: int, seed: int = 0, spread: float = 0.05) -> np.ndarray:
    """Raw bytes [n, row bytes] of a random [n, k] tensor in GGUF format `kind`."""
    import gguf

    rng = np.random.default_rng(seed)
    quant_type = gguf.GGMLQuantizationType[kind]
    block, block_bytes = gguf.GGML_QUANT_SIZES[quant_type]
    if kind in QUANTIZABLE:
        return gguf.quants.quantize((rng.standard_normal((n, k)) * spread).astype(np.float32), quant_type)
    count = n * k // block
    raw = rng.integers(0, 256, (count, block_bytes), dtype=np.uint8)

    def halves() -> np.ndarray:
        return (rng.random(count) * 2e-3 + 1e-4).astype(np.float16).view(np.uint8).reshape(count, 2)

    if kind == "Q6_K":
        raw[:, 208:210] = halves()
    else:  # Q4_K / Q5_K (and Q2_K: d, dmin at the end)
        first = 0 if kind in ("Q4_K", "Q5_K") else block_bytes - 4
        raw[:, first : first + 2] = halves()
        raw[:, first + 2 : first + 4] = halves()
    return raw.reshape(n, -1)


def _interleave_heads(weight: np.ndarray, heads: int) -> np.ndarray:
    """HF rotary halves -> llama.cpp's interleaved rows (what transformers undoes when loading)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (the byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    stand_in, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            stand_in[byte] = chr(byte)
        else:
            stand_in[byte] = chr(256 + extra)
            extra += 1
    return [stand_in[b] for b in range(256)]


def write_tiny_llama_gguf(path: Path, kinds: str | dict[str, str], seed: int = 0, tied: bool = True) -> Path:
    """A 2-layer random Llama with `kinds` linear weights (and embedding), F32 norms, as a GGUF file."""
    import gguf

    rng = np.random.default_rng(seed)
    h, f, heads, kv = TINY["hidden"], TINY["intermediate"], TINY["heads"], TINY["kv_heads"]
    head_dim = h // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(256)
    writer.add_embedding_length(h)
    writer.add_block_count(TINY["layers"])
    writer.add_feed_forward_length(f)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    merges = ["h e", "l l", "ll o", "Ġ w", "o r"]
    merged = [merge.replace(" ", "") for merge in merges]
    tokens = _byte_tokens() + merged + [f"<extra_{i}>" for i in range(TINY["vocab"] - 258 - len(merged))]
    tokens += ["<s>", "</s>"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 2) + [3, 3])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)

    roles = kinds if isinstance(kinds, dict) else {"default": kinds}
    serial = iter(range(1000))

    def add(name: str, rows: int, cols: int, heads_to_interleave: int = 0) -> None:
        role = name.split(".")[-2]
        kind = roles.get(role, roles["default"])
        quant_type = gguf.GGMLQuantizationType[kind]
        data = random_blocks(kind, rows, cols, seed=seed * 1000 + next(serial))
        if heads_to_interleave:  # interleave block rows: a row permutation of whole rows of blocks
            order = _interleave_heads(np.arange(rows), heads_to_interleave)
            data = data[order]
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=quant_type)

    def add_norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    add("token_embd.weight", TINY["vocab"], h)
    if not tied:
        add("output.weight", TINY["vocab"], h)
    add_norm("output_norm.weight", h)
    for layer in range(TINY["layers"]):
        add_norm(f"blk.{layer}.attn_norm.weight", h)
        add_norm(f"blk.{layer}.ffn_norm.weight", h)
        add(f"blk.{layer}.attn_q.weight", h, h, heads)
        add(f"blk.{layer}.attn_k.weight", kv * head_dim, h, kv)
        add(f"blk.{layer}.attn_v.weight", kv * head_dim, h)
        add(f"blk.{layer}.attn_output.weight", h, h)
        add(f"blk.{layer}.ffn_gate.weight", f, h)
        add(f"blk.{layer}.ffn_up.weight", f, h)
        add(f"blk.{layer}.ffn_down.weight", h, f)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

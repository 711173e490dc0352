"""Tiny random Llama-family models written as block-quantized `.gguf` files (gguf's own quantizers), for the native
decoder's tests: each matrix in a different GGUF format, so every weight form the kernels take appears."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from quantized_fixtures import QUANTIZABLE, random_blocks

from assisted_backends.native import decoder_build, extension

VOCAB = 384
native_only = pytest.mark.skipif(
    not extension.available() or bool(decoder_build.why_unavailable()),
    reason="the native decoder needs the package's kernels and a compiler",
)
# matrix -> GGUF format: 4- and 8-bit codes, with and without zeros (a K-quant, which gguf cannot quantize, is
# written as random blocks)
FORMATS = {"attn_q": "Q5_1", "attn_k": "Q5_1", "attn_v": "Q5_1", "attn_output": "Q5_0", "ffn_gate": "Q4_0",
           "ffn_up": "Q4_0", "ffn_down": "Q8_0", "token_embd": "Q4_1", "output": "Q8_0"}  # fmt: skip


def _interleave_heads(weight: np.ndarray, heads: int) -> np.ndarray:
    """GGUF's q/k row order: each head's two rotary halves interleaved (transformers undoes it on load)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, weight.shape[1]).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_llama(path: Path, seed: int = 0, layers: int = 2, hidden: int = 256, heads: int = 4,
                     kv_heads: int = 2, intermediate: int = 512, tied: bool = False) -> Path:  # fmt: skip
    """A random Llama of this shape at `path`, its matrices quantized by gguf to `FORMATS`."""
    gguf = pytest.importorskip("gguf", reason="the native decoder's tests write .gguf files: pip install gguf")
    from gguf import quants

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(VOCAB - 3)])
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    head_dim = hidden // heads

    def matrix(name: str, kind: str, rows: int, columns: int, scale: float, interleave: int = 0) -> None:
        weight = (rng.standard_normal((rows, columns)) * scale).astype(np.float32)
        if interleave:
            weight = _interleave_heads(weight, interleave)
        qtype = getattr(gguf.GGMLQuantizationType, FORMATS[kind])
        if FORMATS[kind] in QUANTIZABLE:
            data = quants.quantize(weight, qtype)
        else:  # a K-quant gguf cannot make: random blocks with sane scales
            data = random_blocks(FORMATS[kind], rows, columns, seed=int(rng.integers(1 << 30)))
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    def vector(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", "token_embd", VOCAB, hidden, 1.0)
    for layer in range(layers):
        stem = f"blk.{layer}"
        vector(f"{stem}.attn_norm.weight", hidden)
        matrix(f"{stem}.attn_q.weight", "attn_q", heads * head_dim, hidden, 0.15, heads)
        matrix(f"{stem}.attn_k.weight", "attn_k", kv_heads * head_dim, hidden, 0.15, kv_heads)
        matrix(f"{stem}.attn_v.weight", "attn_v", kv_heads * head_dim, hidden, 0.15)
        matrix(f"{stem}.attn_output.weight", "attn_output", hidden, heads * head_dim, 0.08)
        vector(f"{stem}.ffn_norm.weight", hidden)
        matrix(f"{stem}.ffn_gate.weight", "ffn_gate", intermediate, hidden, 0.1)
        matrix(f"{stem}.ffn_up.weight", "ffn_up", intermediate, hidden, 0.1)
        matrix(f"{stem}.ffn_down.weight", "ffn_down", hidden, intermediate, 0.06)
    vector("output_norm.weight", hidden)
    if not tied:
        matrix("output.weight", "output", VOCAB, hidden, 0.2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@cache
def tiny_llama(directory: str, tied: bool = False):
    """(reference, native) for a tiny random `.gguf` Llama: transformers' modeling on the kernels with
    batch-invariant attention, and the native decoder over the same weights."""
    from assisted_backends.backends.cpu import invariant_attention
    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized.model import load_gguf_quantized

    path = write_tiny_llama(Path(directory) / f"tiny-llama{'-tied' if tied else ''}.gguf", tied=tied)
    reference = load_gguf_quantized(path, tokenizer=False, use_cache=False).reference
    invariant_attention.enable(reference)
    return reference, NativeCausalLM(reference)


def prompt(length: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))

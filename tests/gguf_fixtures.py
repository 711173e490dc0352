"""Write a tiny random Llama and its byte-level BPE tokenizer as a GGUF file (fp32 tensors), so the
default suite exercises the `.gguf` loading path in under a second without real weights.

The layout follows the GGUF conventions transformers reads back: `llama.*` hyperparameters,
`tokenizer.ggml.*` with model "gpt2" (byte-level BPE: tokens, token types, merges), tensors named
`token_embd`, `blk.N.attn_q` ..., and the query/key rows interleaved per head (transformers undoes that
permutation when it loads a Llama).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

CONTROL, NORMAL = 3, 1  # GGUF token types
_LAYER_TENSORS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _interleave_heads(weight: np.ndarray, heads: int) -> np.ndarray:
    """[heads * 2 * half, in] with each head's two rotary halves interleaved row by row."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _tensor_names(layers: int) -> dict[str, str]:
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    names["lm_head.weight"] = "output.weight"
    for layer in range(layers):
        for hf_name, gguf_name in _LAYER_TENSORS.items():
            names[f"model.layers.{layer}.{hf_name}.weight"] = f"blk.{layer}.{gguf_name}.weight"
    return names


def write_llama_gguf(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> Path:
    """Save `model` (untied Llama, fp32) and `tokenizer` (byte-level BPE) as one GGUF file at `path`."""
    import gguf

    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)  # transformers 4.51 reads general.name
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = [""] * len(tokenizer)
    for token, index in spec["model"]["vocab"].items():
        tokens[index] = token
    special = {added["id"] for added in spec["added_tokens"]}
    for added in spec["added_tokens"]:
        tokens[added["id"]] = added["content"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if index in special else NORMAL for index in range(len(tokens))])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])

    names = _tensor_names(config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy()
        if ".q_proj." in name:
            array = _interleave_heads(array, config.num_attention_heads)
        elif ".k_proj." in name:
            array = _interleave_heads(array, config.num_key_value_heads)
        writer.add_tensor(names[name], np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

"""Tiny random decoder-only models of many architectures, built from configs in well under a second.

Each entry names a transformers `model_type` and the config fields that make it tiny (2 layers,
hidden 64, vocabulary 128) and, where the architecture has one, a sliding window shorter than the
sequences the tests generate, so that window, hybrid and chunked cache layers really drop positions.
Architectures the installed transformers does not know are reported as skips, not failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

VOCAB = 128
WINDOW = 12  # shorter than every prompt + generation in the matrix
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.5,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    tie_word_embeddings=False,
)


@dataclass(frozen=True)
class Arch:
    """One architecture of the matrix: `model_type`, the fields that differ from COMMON, and its cache kinds."""

    model_type: str
    overrides: dict = field(default_factory=dict)
    cache_kinds: str = "full"  # full | sliding | hybrid (sliding + full layers) | chunked (+ full) | alibi
    drop: tuple[str, ...] = ()  # COMMON fields the config does not take


_GPT_STYLE = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")

ARCHS: tuple[Arch, ...] = (
    Arch("llama"),
    Arch("mistral", dict(sliding_window=WINDOW, head_dim=16), "sliding"),
    Arch("mixtral", dict(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2), "sliding"),
    Arch("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1), "hybrid"),
    Arch("qwen3", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, head_dim=16), "hybrid"),
    Arch(
        "qwen3_moe",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16, decoder_sparse_step=1),
    ),
    Arch("gemma", dict(head_dim=16)),
    Arch(
        "gemma2",
        dict(sliding_window=WINDOW, head_dim=16, layer_types=["sliding_attention", "full_attention"]),
        "hybrid",
    ),
    Arch(
        "gemma3_text",
        dict(sliding_window=WINDOW, head_dim=16, layer_types=["sliding_attention", "full_attention"]),
        "hybrid",
    ),
    Arch("phi", dict(partial_rotary_factor=0.5)),
    Arch("phi3", dict(sliding_window=WINDOW), "sliding"),
    Arch("starcoder2", dict(sliding_window=WINDOW), "sliding"),
    Arch("gpt_neox", dict(rotary_pct=0.5), drop=("num_key_value_heads",)),
    Arch(
        "gptj",
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, rotary_dim=8),
        drop=_GPT_STYLE + ("max_position_embeddings",),
    ),
    Arch("falcon", dict(new_decoder_architecture=True, num_kv_heads=2), drop=("num_key_value_heads",)),
    Arch("bloom", dict(n_layer=2, n_head=4), "alibi", drop=_GPT_STYLE + ("max_position_embeddings",)),
    Arch(
        "opt",
        dict(ffn_dim=128, word_embed_proj_dim=64, init_std=0.5, pad_token_id=1),
        drop=("intermediate_size", "num_key_value_heads", "initializer_range"),
    ),
    Arch("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256), drop=_GPT_STYLE + ("max_position_embeddings",)),
    Arch(
        "gpt_bigcode",
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, multi_query=True),
        drop=_GPT_STYLE + ("max_position_embeddings",),
    ),
    Arch("olmo"),
    Arch("olmo2"),
    Arch("stablelm", dict(partial_rotary_factor=0.5)),
    Arch("cohere", dict(logit_scale=1.0)),
    Arch(
        "cohere2",
        dict(sliding_window=WINDOW, logit_scale=1.0, layer_types=["sliding_attention", "full_attention"]),
        "hybrid",
    ),
    Arch("granite"),
    Arch(
        "llama4_text",
        dict(
            attention_chunk_size=8,
            head_dim=16,
            intermediate_size_mlp=128,
            num_local_experts=2,
            num_experts_per_tok=1,
            no_rope_layers=[1, 0],
            interleave_moe_layer_step=1,
            moe_layers=[0, 1],
        ),
        "chunked",
    ),
    Arch(
        "qwen2_moe",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    ),
)
# Every other decoder-only `model_type` of transformers 5.23 that builds from COMMON alone, under 3M
# parameters, in well under a second (found by trying all of MODEL_FOR_CAUSAL_LM_MAPPING): tested for
# identity with their defaults on transformers >= 5 (BREADTH_FROM), and the ones whose cache cannot roll
# back for a clear refusal. On 4.51/4.55 some of them crash inside transformers' own StaticCache (it
# sizes heads from config fields these models ignore) or take no position_ids: not covered there.
BREADTH_FROM = (5, 0)
BREADTH_TYPES = (
    "apertus",
    "arcee",
    "aria_text",
    "beam",
    "biogpt",
    "bitnet",
    "cohere2_moe",
    "ctrl",
    "diffllama",
    "doge",
    "ernie4_5",
    "exaone4",
    "flex_olmo",
    "glm",
    "glm4",
    "gpt-sw3",
    "gpt_neox_japanese",
    "granite_swa",
    "granitemoe",
    "granitemoe_swa",
    "granitemoeshared",
    "hyperclovax",
    "internlm3",
    "iquestcoder",
    "jais2",
    "jetmoe",
    "lfm2",
    "ministral3",
    "mpt",
    "nanochat",
    "nemotron",
    "olmo3",
    "persimmon",
    "phimoe",
    "seed_oss",
    "smollm3",
    "trocr",
    "vaultgemma",
    "xglm",
)
REFUSED_TYPES = (  # recurrent / linear-attention state, KV shared across layers, or no KV cache at all
    "falcon_h1",
    "falcon_mamba",
    "mamba",
    "minimax",
    "olmo_hybrid",
    "rwkv",
    "gemma4_unified_text",
    "openai-gpt",
)
ARCH_NAMES = tuple(arch.model_type for arch in ARCHS)
SLIDING_ARCHS = tuple(arch.model_type for arch in ARCHS if arch.cache_kinds == "sliding")
HYBRID_ARCHS = tuple(arch.model_type for arch in ARCHS if arch.cache_kinds == "hybrid")
_BY_NAME = {arch.model_type: arch for arch in ARCHS}
VERSION = tuple(int(part) for part in transformers.__version__.split(".")[:2])
# Before these transformers releases, these windowed models build masks that a cache which rolls back
# cannot serve (a HybridCache before 4.55; chunked masks before 5.0): the package must refuse them there,
# with an upgrade hint, and never return wrong tokens.
REFUSED_BEFORE = {"gemma2": (4, 55), "gemma3_text": (4, 55), "cohere2": (4, 55), "llama4_text": (5, 0)}


def refused_here(model_type: str) -> bool:
    """Whether the package must refuse `model_type` with the installed transformers."""
    return VERSION < REFUSED_BEFORE.get(model_type, (0, 0))


class UnknownArchitecture(Exception):
    """The installed transformers does not know this model type (or cannot build it tiny)."""


def build(model_type: str, seed: int, eos_token_id: int | None = None, **changes) -> PreTrainedModel:
    """A random fp32 model of `model_type`, deterministic in `seed`, in eval mode, eager attention."""
    arch = _BY_NAME.get(model_type, Arch(model_type))
    fields = {key: value for key, value in COMMON.items() if key not in arch.drop}
    fields.update(arch.overrides)
    fields.update(changes)
    fields["eos_token_id"] = eos_token_id
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except (KeyError, ValueError) as error:
        raise UnknownArchitecture(f"{model_type}: {error}") from error
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval()

"""Tiny random causal LMs built from configs (no downloads), for the four families the seeds use.

A large `initializer_range` spreads the logits so greedy paths vary from token to token and two
models with different seeds disagree often (an "unrelated" draft then accepts almost nothing).
"""

from __future__ import annotations

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTBigCodeConfig,
    GPTBigCodeForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PreTrainedModel,
)

VOCAB = 128
MAX_POSITIONS = 256
ARCHITECTURES = ("llama", "opt", "gpt2", "gpt_bigcode")
_NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None)


def tiny_model(
    arch: str,
    seed: int,
    hidden: int = 64,
    layers: int = 2,
    vocab: int = VOCAB,
    max_positions: int = MAX_POSITIONS,
    init: float = 0.5,
    eos_token_id: int | None = None,
) -> PreTrainedModel:
    """A random fp32 model of family `arch`, deterministic in `seed`."""
    special = dict(_NO_SPECIAL, eos_token_id=eos_token_id)
    if arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            initializer_range=init,
            pad_token_id=None,
            **special,
        )
        model_class = LlamaForCausalLM
    elif arch == "opt":
        config = OPTConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            ffn_dim=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            max_position_embeddings=max_positions,
            word_embed_proj_dim=hidden,
            init_std=init,
            pad_token_id=1,
            **special,
        )
        model_class = OPTForCausalLM
    elif arch == "gpt2":
        config = GPT2Config(
            vocab_size=vocab,
            n_embd=hidden,
            n_layer=layers,
            n_head=4,
            n_positions=max_positions,
            initializer_range=init,
            **special,
        )
        model_class = GPT2LMHeadModel
    elif arch == "gpt_bigcode":
        config = GPTBigCodeConfig(
            vocab_size=vocab,
            n_embd=hidden,
            n_layer=layers,
            n_head=4,
            n_positions=max_positions,
            initializer_range=init,
            multi_query=True,
            **special,
        )
        model_class = GPTBigCodeForCausalLM
    else:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {ARCHITECTURES}")
    torch.manual_seed(seed)
    return model_class(config).eval()


def reference_greedy(model: PreTrainedModel, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """The target's own plain greedy `model.generate` on the same arguments as the package's call (the identity
    reference): no mask given, so a pad token inside the prompt (OPT's is 1) is masked out, as both infer."""
    with torch.inference_mode():
        return model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)


def noisy_copy(model: PreTrainedModel, seed: int, scale: float) -> PreTrainedModel:
    """The same architecture and weights plus Gaussian noise: a draft with mid-to-high acceptance."""
    torch.manual_seed(seed)
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(scale * parameter.std().nan_to_num(0.0) * torch.randn_like(parameter))
    return copy


def random_prompt(length: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))

"""`Eagle3Head`: EAGLE-3's draft network, with the parameter names both published layouts use.

Notation (Li et al. 2025, EAGLE-3): at column t the target computed the residual streams l_t, m_t, h_t
entering a low, a middle and a high layer; g_t = fc([l_t; m_t; h_t]) (fc: [H, 3 H_t]). The head's one
decoder layer reads, at column t, the embedding e_{t+1} of the *next* token and a hidden state a_t:

    a_t = g_t                      where the target's features exist (committed columns)
    a_t = o_{t−1}                  while drafting: the layer's own output one column earlier
    x   = [RMSNorm_in(e_{t+1}); RMSNorm_hidden(a_t)]                  (2H: embedding first)
    r   = a_t + o_proj(Attention(q(x), k(x), v(x)))                    (rotary positions t)
    o_t = r + MLP(RMSNorm_post(r))
    logits over the draft vocabulary = lm_head(RMSNorm(o_t))            ([V_d]; target id = d + d2t[d])

`norm_before_residual` (a vLLM option) takes the residual after RMSNorm_hidden. Attention is a callable so
that the same layer serves decoding on a KV cache (`drafters.eagle.cache`) and training-time test
(`train_draft.ttt`). Parameter names: `fc`, `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}`,
`midlayer.self_attn.{q,k,v,o}_proj`, `midlayer.mlp.{gate,up,down}_proj`, `norm`, `lm_head`, buffers `d2t`
[V_d] int64 and `t2d` [V] bool, and `embed_tokens` when the checkpoint carries one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from assisted_backends.drafters.eagle.config import Eagle3Config

# attend(q [B, heads, q, d], k [B, kv_heads, q, d], v [B, kv_heads, q, d]) -> [B, heads, q, d]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    """weight · x / sqrt(mean(x²) + ε), computed in fp32 as Llama's."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """q, k, v from the 2H-wide input; o back to H. The attention itself is the caller's (`Attend`)."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h, d = config.hidden_size, config.attention_head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        bias = config.attention_bias
        self.q_proj = nn.Linear(2 * h, self.heads * d, bias=bias)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.heads * d, h, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = attend(q, k, v)  # [B, heads, q, d]
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The head's decoder layer (module docstring): (e [B, q, H], a [B, q, H]) -> o [B, q, H]."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.norm_before_residual = config.norm_before_residual

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [B, q, 2H]: the embedding first
        r = residual + self.self_attn(x, cos, sin, attend)
        return r + self.mlp(self.post_attention_layernorm(r))


def _rope_config(config: Eagle3Config) -> LlamaConfig:
    """A LlamaConfig that only carries the head's rotary settings (any rope type transformers knows)."""
    scaling = dict(config.rope_scaling) if config.rope_scaling else None
    if scaling is not None and "rope_type" not in scaling and "type" in scaling:
        scaling["rope_type"] = scaling["type"]
    return LlamaConfig(
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        head_dim=config.attention_head_dim,
        rope_theta=config.rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=config.max_position_embeddings,
    )


class Eagle3Head(nn.Module):
    """An EAGLE-3 head (module docstring). `embed_tokens` is None when the target's embedding is to be used."""

    def __init__(self, config: Eagle3Config, with_embeddings: bool = False) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if with_embeddings else None
        self.fc = nn.Linear(config.fused_width, h, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(_rope_config(config))  # inv_freq is not persistent: not in the state dict
        self._target_embedding: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None
        self._target_rows: int | None = None
        self._precision = "auto"
        self.held_out_alpha: float | None = None  # α_1 on its training run's held-out prompts, when known (`load_head`)

    # --- precision ------------------------------------------------------------------------------------------

    @property
    def precision(self) -> str:
        """The precision it drafts in next to a target (`drafters.eagle.precision`): "auto" (default), "float",
        "bf16", "int8" or "int4". A setting, not part of its state: the loaded weights stay as they are."""
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        from assisted_backends.drafters.eagle.precision import check_head_precision

        self._precision = check_head_precision(value)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of its activations (its norms' weights: its linear layers may be quantized)."""
        return self.norm.weight.dtype

    @property
    def compute_device(self) -> torch.device:
        return self.norm.weight.device

    # --- inputs ---------------------------------------------------------------------------------------------

    def use_target_embedding(
        self, table: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None, rows: int | None = None
    ) -> None:
        """Embed tokens with the target's input embedding (the EAGLE authors' layout ships none): its weight [V, H],
        or a row lookup `ids -> rows` over `rows` ids for a quantized table. Kept outside the module's state, never
        registered: it is the target's, not part of the head's state or its training."""
        tensor = isinstance(table, torch.Tensor)
        self.__dict__["_target_embedding"] = table.detach() if tensor else table
        self.__dict__["_target_rows"] = int(table.shape[0]) if tensor else rows

    def embedding_rows(self) -> int:
        """How many token ids the head can embed."""
        if self.embed_tokens is not None:
            return int(self.embed_tokens.weight.shape[0])
        self.embedding_weight()  # raises when there is no table
        return self._target_rows if self._target_rows is not None else self.config.vocab_size

    def embedding_weight(self) -> torch.Tensor | Callable[[torch.Tensor], torch.Tensor]:
        if self.embed_tokens is not None:
            return self.embed_tokens.weight
        if self._target_embedding is None:
            raise RuntimeError("this EAGLE-3 head has no embed_tokens: call use_target_embedding(target weight) first")
        return self._target_embedding

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """e [B, q, H]: a plain lookup (a target's own embedding scale, e.g. Gemma's √H, is left out: the
        head's input norm makes it irrelevant, and training and decoding do the same)."""
        table = self.embedding_weight()
        rows = nn.functional.embedding(token_ids, table) if isinstance(table, torch.Tensor) else table(token_ids)
        return rows.to(self.compute_dtype)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """g [B, q, H] = fc([l; m; h]) for target features [B, q, 3 H_t]."""
        return self.fc(features.to(self.compute_dtype))

    # --- the layer and the head -----------------------------------------------------------------------------

    def rotary_embedding(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, q, d] for position ids [B, q]."""
        return self.rotary(self.norm.weight, positions)

    def forward(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """o [B, q, H] for the next tokens [B, q], hidden states a [B, q, H] and position ids [B, q]."""
        cos, sin = self.rotary_embedding(positions)
        return self.midlayer(self.embed(token_ids), hidden, cos, sin, attend)

    def draft_logits(self, output: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [..., V_d] for layer outputs o [..., H]."""
        return self.lm_head(self.norm(output))

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids for draft ids: d + d2t[d]."""
        return draft_ids + self.d2t[draft_ids]

    def mapped_ids(self) -> torch.Tensor:
        """[V_d] the target id of every draft id."""
        return self.target_ids(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))

    def target_logits(self, draft_logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Float logits [..., V] over the target's vocabulary: the draft's at the mapped ids, −inf elsewhere,
        so the softmax is the head's distribution carried over through d2t (zero outside the mapped ids)."""
        full = draft_logits.new_full((*draft_logits.shape[:-1], vocab_size), float("-inf"), dtype=torch.float32)
        full[..., self.mapped_ids()] = draft_logits.float()
        return full

    def body_parameters(self) -> int:
        """Parameters a step runs outside the embedding: fc, the layer, the norm and lm_head."""
        return sum(p.numel() for name, p in self.named_parameters() if not name.startswith("embed_tokens"))

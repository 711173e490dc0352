"""A new EAGLE-3 head shaped after its target, and the parts of the target it starts from.

The head mirrors the target's attention shape (heads, kv heads, head dim), MLP width, norm ε and rotary base,
over a draft vocabulary of V_d tokens. Its `norm` starts as the target's final norm (the effective scale,
read by applying that norm to a vector of ones, so Gemma's 1 + w form is covered) and its `lm_head` as the
target's output rows of the draft tokens: the EAGLE and EAGLE-2 heads reused the target's LM head, which is a
good output space to start from. Everything else starts at PyTorch's default initialisation.
"""

from __future__ import annotations

import torch

from assisted_backends import hf_compat
from assisted_backends.drafters.eagle.config import Eagle3Config
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.train_draft.target_tables import dense_rows


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    parameters = getattr(config, "rope_parameters", None) or {}
    if theta is None and isinstance(parameters, dict):
        theta = parameters.get("rope_theta") or (parameters.get("full_attention") or {}).get("rope_theta")
    return float(theta or 10000.0)


def head_config(target: torch.nn.Module, d2t: torch.Tensor, t2d: torch.Tensor, layers: tuple[int, ...]) -> Eagle3Config:
    config = hf_compat.text_config(target)
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    return Eagle3Config(
        hidden_size=hidden,
        intermediate_size=int(getattr(config, "intermediate_size", None) or 4 * hidden),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
        vocab_size=int(t2d.shape[0]),
        draft_vocab_size=int(d2t.shape[0]),
        rms_norm_eps=float(getattr(config, "rms_norm_eps", None) or 1e-6),
        rope_theta=_rope_theta(config),
        max_position_embeddings=int(getattr(config, "max_position_embeddings", None) or 4096),
        feature_layers=tuple(layers),
    )


def _final_norm_scale(target: torch.nn.Module, width: int) -> torch.Tensor | None:
    """The target's final norm as a per-channel scale when it is scale-invariant (an RMSNorm), else None."""
    decoder = target.get_decoder() if callable(getattr(target, "get_decoder", None)) else getattr(target, "model", None)
    norm = next((getattr(decoder, n) for n in ("norm", "ln_f", "final_layer_norm") if hasattr(decoder, n)), None)
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.shape != (width,):
        return None
    with torch.no_grad():
        ones = torch.ones(1, width, dtype=weight.dtype, device=weight.device)
        one, two = norm(ones), norm(2 * ones)
    return one[0].float().cpu() if torch.allclose(one, two, rtol=1e-4, atol=1e-5) else None


def new_head(
    target: torch.nn.Module, d2t: torch.Tensor, t2d: torch.Tensor, layers: tuple[int, ...], seed: int
) -> Eagle3Head:
    """A fresh fp32 head for `target` over the draft vocabulary (d2t, t2d)."""
    torch.manual_seed(seed)
    head = Eagle3Head(head_config(target, d2t, t2d, layers))
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    try:
        weight = dense_rows(target.get_output_embeddings())
    except TypeError:  # an output layer of another kind: the head's own initialization stays
        weight = None
    with torch.no_grad():
        if isinstance(weight, torch.Tensor) and weight.shape[-1] == head.config.hidden_size:
            head.lm_head.weight.copy_(weight[head.mapped_ids().to(weight.device)].float().cpu())
            scale = _final_norm_scale(target, head.config.hidden_size)
            if scale is not None:
                head.norm.weight.copy_(scale)
    return head

"""Batch-invariant attention: each query row of a verify pass attends exactly as a one-token step does.

A verify pass feeds γ + 1 positions at once. The model's attention then multiplies all γ + 1 queries by
the keys in one call, and transformers' SDPA path even takes another route for one query than for
several (GQA packing), so row j's output can differ in the last bits from the one-token decode step that
would have computed it; fed to bf16 activations and on through the layers, such a difference can flip a
greedy near-tie. With quantized weights, whose CPU kernels compute every row alone
(`quantized.kernels`), attention is the one op of a Llama-like layer that mixes rows. Here each query
row j is computed alone through the model's own SDPA attention, over the keys a one-token step at its
position sees (the first L_j columns, L_j = its last attended column + 1), with the mask dropped where it
masks nothing, as it is in a decode step: bit for bit the step's result, for decode steps too.

Where the package's kernels run (`native.extension`), all rows go to one call of its row-attention kernel,
which computes each row alone in one fixed order (no Python loop over rows: prefill of a long prompt stays one
call a layer); elsewhere each row goes through SDPA as described above.

Used for quantized targets on the CPU (`CPUBackend.prepare`); models whose attention SDPA cannot compute
(logit soft-capping, attention sinks) keep their own attention (`supported`).
"""

from __future__ import annotations

import torch

NAME = "assisted_batch_invariant"


def _lengths(attention_mask: torch.Tensor | None, query_length: int, key_length: int) -> list[int]:
    """L_j for each query row j: its last attended key column + 1 (any row of the batch)."""
    if attention_mask is None:  # causal without padding: row j sees the keys up to its own position
        return [key_length - (query_length - 1 - j) for j in range(query_length)]
    attended = attention_mask.bool().any(dim=0).any(dim=0)  # [q, T]
    columns = torch.arange(1, attended.shape[-1] + 1, device=attended.device)
    return (attended * columns).amax(dim=-1).tolist()


def batch_invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, q, D]
    key: torch.Tensor,  # [B, H_kv, T, D]
    value: torch.Tensor,  # [B, H_kv, T, D]
    attention_mask: torch.Tensor | None,  # [B, 1, q, T] bool, or None
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ([B, q, H, D], None), one query row at a time."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("is_causal", None)
    if _row_kernel_serves(query, attention_mask, kwargs):
        return _row_kernel(query, key, value, attention_mask, kwargs.get("scaling")), None
    rows = []
    for j, length in enumerate(_lengths(attention_mask, query.shape[2], key.shape[2])):
        mask = None if attention_mask is None else attention_mask[:, :, j : j + 1, :length]
        if mask is not None and bool(mask.all()):
            mask = None  # a decode step attending everything has no mask
        keys, values = key[:, :, :length], value[:, :, :length]
        if mask is not None and mask.shape[:2] == (1, 1) and mask.dtype == torch.bool:
            # one mask for all (a token tree's row): its attended keys alone, in position order, and no mask
            index = mask[0, 0, 0].nonzero().squeeze(-1)
            keys, values, mask = keys.index_select(2, index), values.index_select(2, index), None
        out, _ = sdpa_attention_forward(module, query[:, :, j : j + 1], keys, values, mask, is_causal=False, **kwargs)
        rows.append(out)  # [B, 1, H, D]
    return torch.cat(rows, dim=1), None


def _row_kernel_serves(query: torch.Tensor, attention_mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether the package's row-attention kernel computes this call (fp32, a boolean mask or none, no sinks)."""
    from assisted_backends.native import extension

    plain = attention_mask is None or attention_mask.dtype == torch.bool
    return plain and query.dtype == torch.float32 and kwargs.get("s_aux") is None and extension.available()


def _row_kernel(query, key, value, attention_mask, scaling: float | None) -> torch.Tensor:
    """All rows in one call of `row_attention` (native/csrc/row_attention.cpp): each row over its own keys
    t < L_j in one fixed order of fp32 operations, so the same bits whatever the number of rows."""
    from assisted_backends.native import extension

    q_len, key_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        lengths = torch.arange(key_len - q_len + 1, key_len + 1)
    else:
        attended = attention_mask.any(dim=0).any(dim=0)  # [q, T]
        lengths = (attended * torch.arange(1, key_len + 1)).amax(dim=-1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return torch.ops.assisted_backends.row_attention.default(
        query, key, value, attention_mask, lengths, scale, extension.forced_isa()
    )


def supported(model: torch.nn.Module) -> str | None:
    """Why `model` cannot use batch-invariant attention here (None: it can)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401  (transformers >= 4.53)
    except ImportError:
        return "this transformers has no attention interface for it (4.53 or newer needed)"
    del AttentionInterface
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "attn_logit_softcapping", None) or getattr(text, "final_attn_softcapping", None):
        return "its attention soft-caps logits, which SDPA cannot compute"
    if not getattr(model, "_supports_sdpa", False):
        return "its attention has no SDPA path"
    return None


def verify_pass_difference(model: torch.nn.Module) -> str | None:
    """Which op keeps a quantized model's verify pass from computing its one-token steps' logits bit for bit
    (None: none does). Weight-only int8/int4 kernels compute each row alone; float matmuls do not."""
    from assisted_backends.quantized.linear import QuantizedLinear

    if getattr(model.config, "_attn_implementation", None) != NAME:
        return f"its attention ({getattr(model.config, '_attn_implementation', None)}) sees all rows at once"
    if any(p.dim() == 3 and p.is_floating_point() for p in model.parameters()):
        return "its experts' fused float weights are multiplied by the tokens routed to them together"
    kept = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and not isinstance(m, QuantizedLinear)]
    if kept:
        return f"{len(kept)} linear layer(s) the kernels cannot take stay float (fp32 matmul depends on the row count)"
    return None


def enable(model: torch.nn.Module) -> bool:
    """Switch `model` to batch-invariant attention (registered once); False, model unchanged, where `supported`
    says no."""
    if supported(model) is not None:
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, batch_invariant_attention)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(NAME, sdpa_mask)
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(NAME)
    else:
        model.config._attn_implementation = NAME
    return getattr(model.config, "_attn_implementation", None) == NAME  # some models refuse a switch (Falcon)

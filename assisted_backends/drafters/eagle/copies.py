"""An EAGLE-3 head's copies at a precision (`drafters.eagle.precision`): in another float dtype, or with its linear
layers on the package's int8/int4 block kernels; and the bytes of weights a draft step reads."""

from __future__ import annotations

import copy

import torch

from assisted_backends.drafters.eagle.head import Eagle3Head, _rope_config
from assisted_backends.drafters.eagle.precision import SCHEMES
from assisted_backends.quantized import blocks
from assisted_backends.quantized.linear import QuantizedLinear

LINEAR_LAYERS = (
    "fc", "midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj",
    "midlayer.self_attn.o_proj", "midlayer.mlp.gate_proj", "midlayer.mlp.up_proj", "midlayer.mlp.down_proj", "lm_head",
)  # fmt: skip


def _shared_memo(head: Eagle3Head) -> dict[int, object]:
    """deepcopy's memo that keeps the embedding tables shared (a lookup: their dtype does not matter)."""
    memo: dict[int, object] = {}
    for table in (head.embed_tokens, head.__dict__.get("_target_embedding")):
        if table is not None:
            memo[id(table)] = table
    return memo


def float_copy(head: Eagle3Head, dtype: torch.dtype, device: torch.device) -> Eagle3Head:
    """`head` in `dtype` on `device` (its own embedding table included; the target's stays shared)."""
    memo = {k: v for k, v in _shared_memo(head).items() if v is not head.embed_tokens}
    prepared = copy.deepcopy(head, memo).to(device=device, dtype=dtype).eval()
    prepared.rotary = type(head.rotary)(_rope_config(head.config)).to(device)  # inv_freq kept in fp32
    return prepared


def quantized_copy(head: Eagle3Head, scheme: str) -> tuple[Eagle3Head, dict[str, str]]:
    """A copy of `head` on the CPU whose linear layers run on the package's kernels as `scheme` ("int8"/"int4"),
    the rest in fp32, the embedding table shared with `head`; and per layer what was done."""
    prepared = copy.deepcopy(head, _shared_memo(head)).to("cpu")
    for name, module in prepared.named_children():
        if name != "embed_tokens":
            module.to(device="cpu", dtype=torch.float32)
    prepared.rotary = type(head.rotary)(_rope_config(head.config))
    report: dict[str, str] = {}
    for name in LINEAR_LAYERS:
        parent_name, _, attribute = name.rpartition(".")
        parent = prepared.get_submodule(parent_name)
        layer = getattr(parent, attribute)
        weight = blocks.from_float(layer.weight.detach(), SCHEMES[scheme])
        if weight is None:
            report[name] = f"kept fp32: in_features {layer.in_features} is not a multiple of {blocks.BLOCK}"
            continue
        setattr(parent, attribute, QuantizedLinear(weight, layer.bias))
        report[name] = scheme
    prepared.quantization_report = report
    return prepared.eval(), report


def step_bytes(head: torch.nn.Module) -> int:
    """Bytes of the weights one draft step reads: every parameter and quantized layer buffer of `head` but its
    embedding table (a lookup) and the vocabulary maps."""
    total, seen = 0, set()
    for module_name, module in head.named_modules():
        if module_name.startswith("embed_tokens"):
            continue
        tensors = list(module.parameters(recurse=False))
        if isinstance(module, QuantizedLinear):
            tensors += [t for t in module.buffers(recurse=False) if t is not None]
        for tensor in tensors:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    return total

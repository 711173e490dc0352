"""`w8af32`: the draft's linear weights in int8 (one scale per output channel), fp32 activations at
every module boundary.

Two compute paths, both PyTorch's own kernels; which one is the default was measured on this
machine (benchmarks/w8af32_paths.py -> benchmarks/results/w8af32_paths.json, and
benchmarks/xeon_draft_step.py):

- "int8pack" (default): weight-only int8 with bf16 compute inside, `torch.ops.aten._weight_int8pack_mm`
  (a maintained core op; the kernel torchao's int8 weight-only path and gpt-fast lower to), through
  `quantized.linear.QuantizedLinear` (the package's one int8/int4 layer). The op reads garbage (or
  crashes) when the input width is not a multiple of 16 on the CPU, so such layers keep their fp32
  weights. Activations stay unquantized, so the draft agrees
  with its fp32 self about as often as before (far more often than the `dynamic` copy: benchmarks/RESULTS.md,
  "Why the code is the way it is").
- "dynamic": `torch.ao.quantization.quantize_dynamic` with per-channel int8 weights; each linear also
  quantizes its fp32 input on the fly and multiplies int8 x int8 (fbgemm / oneDNN). Faster per step
  (0.39x fp32 against int8pack's 0.56x on SmolLM2 here) but `torch.ao.quantization` is deprecated
  (slated for removal) and the activation rounding costs acceptance on real models. Opt in with
  `assisted_backends.backends.cpu.quantize.DEFAULT_METHOD = "dynamic"` while this torch still has it.
- torchao (`Int8WeightOnlyConfig`) was measured too: 1.8x *slower* than fp32 in eager mode here (its
  CPU speed needs `torch.compile` with freezing); it is not used.

What is never done: int8 weights dequantized to fp32 for every call (several times slower than fp32).
Transformers' GPT-2 style `Conv1D` layers (weights stored [in, out]) become `nn.Linear` first so both
paths see them.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from assisted_backends.quantized.linear import quantize_model

METHODS = ("dynamic", "int8pack")
DEFAULT_METHOD = "int8pack"
QUANTIZED_ATTRIBUTE = "_assisted_backends_w8af32"  # set on a quantized model: the method used


def _conv1d_to_linear(model: nn.Module) -> None:
    """Replace transformers' `Conv1D` (y = x W + b, W [in, out]) by the equivalent `nn.Linear`."""
    from transformers.pytorch_utils import Conv1D

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                in_features, out_features = child.weight.shape
                linear = nn.Linear(in_features, out_features, bias=child.bias is not None)
                with torch.no_grad():
                    linear.weight.copy_(child.weight.t())
                    if child.bias is not None:
                        linear.bias.copy_(child.bias)
                setattr(parent, name, linear)


def _int8pack(model: nn.Module) -> None:
    # every linear whose width the kernel takes (K % 16 == 0); activations stay fp32 (the "af32" of w8af32)
    quantize_model(model, "int8", embeddings=False, activations="float")


def _dynamic(model: nn.Module) -> nn.Module:
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch >= 2.10 marks torch.ao.quantization deprecated (moving to torchao)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*", category=UserWarning)
        return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


def check_supported(method: str | None = None) -> None:
    """Raise a clear error when this torch build cannot run `method` (default: DEFAULT_METHOD)."""
    method = method or DEFAULT_METHOD
    if method not in METHODS:
        raise ValueError(f"w8af32 method {method!r} is not one of {METHODS}")
    if method == "dynamic":
        engines = torch.backends.quantized.supported_engines
        if not any(engine in engines for engine in ("x86", "fbgemm", "onednn", "qnnpack")):
            raise RuntimeError(
                f"draft_precision='w8af32' needs a quantized engine (x86/fbgemm/onednn); this torch build has {engines}"
            )
    elif not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        raise RuntimeError("draft_precision='w8af32' (int8pack) needs torch >= 2.4 (aten._weight_int8pack_mm)")


def quantize_w8af32(model: nn.Module, method: str | None = None) -> nn.Module:
    """A w8af32 copy of `model` (the original is left as it was): fp32 everywhere, linear weights int8."""
    method = method or DEFAULT_METHOD
    check_supported(method)
    if getattr(model, QUANTIZED_ATTRIBUTE, None) == method:
        return model
    quantized = copy.deepcopy(model).float().eval()
    _conv1d_to_linear(quantized)
    if method == "dynamic":
        quantized = _dynamic(quantized)
    else:
        _int8pack(quantized)
    setattr(quantized, QUANTIZED_ATTRIBUTE, method)
    return quantized


def is_quantized(model: nn.Module) -> bool:
    return getattr(model, QUANTIZED_ATTRIBUTE, None) is not None

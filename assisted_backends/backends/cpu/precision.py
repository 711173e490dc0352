"""Which dtype the target and the draft run in on a CPU, and why (pure functions, easy to test).

`dtype` (the target):
- None: keep the model's own dtype (the reference path; like `model.generate`); a model loaded with
  quantized weights (a `.gguf` file) keeps them.
- "auto": bf16 where the CPU has AMX-BF16 or AVX512-BF16, else fp32.
- "fp32" / "bf16" / "fp16": forced; bf16 and fp16 are refused where they would be emulated.
- "int8" / "int4": weight-only quantized linear layers (per-row int8, or int4 in groups of 32) on
  PyTorch's CPU kernels, bf16 inside the kernels and fp32 between them (`quantized.linear`); the
  model is quantized in place, as a cast is.

`draft_precision` (the draft):
- None: whatever the target resolved to (None keeps the draft's own dtype).
- "fp32" / "bf16" / "int8" / "int4": as above, on a copy of the draft.
- "w8af32": int8 linear weights with per-output-channel scales, fp32 activations at module
  boundaries (see `quantize.py`); "int8" with a choice of kernel (`quantize.METHODS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assisted_backends.backends.base import DTYPES
from assisted_backends.backends.cpu.cpu_features import CPUFeatures
from assisted_backends.options.errors import OptionError

QUANTIZED = ("int8", "int4")
TARGET_CHOICES = ("auto", *DTYPES, *QUANTIZED)
DRAFT_CHOICES = ("fp32", "bf16", *QUANTIZED, "w8af32")
_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class UnsupportedPrecisionError(OptionError):
    """A precision this CPU or this install cannot serve at speed; the message says what to pass instead."""


@dataclass(frozen=True)
class Choice:
    """A resolved precision: `dtype` None means "leave the model as it is"; `quantize` names the weight-only
    scheme ("int8", "int4", "w8af32"; None: no quantization)."""

    name: str  # "fp32", "bf16", "fp16", "int8", "int4", "w8af32", or "model" (kept as loaded)
    dtype: torch.dtype | None
    reason: str
    quantize: str | None = None


def _normalise(value: str | None) -> str | None:
    if value is None:
        return None
    value = str(value).lower()
    return _ALIASES.get(value, value)


def _forced(name: str, who: str, features: CPUFeatures) -> Choice:
    if name == "bf16" and not features.native_bf16:
        raise UnsupportedPrecisionError(
            f"{{asked}} was asked for, but this CPU ({features.summary()}) has neither AMX-BF16 nor AVX512-BF16: "
            "bf16 would be emulated and slower than fp32. Pass {fix} (or 'auto' for the target).",
            asked=(who, "bf16"),
            fix=(who, "fp32"),
        )
    if name == "fp16" and not features.native_fp16:
        raise UnsupportedPrecisionError(
            f"{{asked}} was asked for, but this CPU ({features.summary()}) has neither AMX-FP16 nor AVX512-FP16. "
            "Pass {fix} where the CPU has AMX-BF16 or AVX512-BF16, else 'fp32'.",
            asked=(who, "fp16"),
            fix=(who, "bf16"),
        )
    reason = f"{who}={name!r} asked for"
    if name == "bf16":
        reason += f"; runs on {features.bf16_support()}"
    return Choice(name, DTYPES[name], reason)


def target_choice(dtype: str | None, features: CPUFeatures) -> Choice:
    """The target's precision for `dtype` (see the module docstring)."""
    name = _normalise(dtype)
    if name is None:
        return Choice("model", None, "dtype not given: the model keeps its own dtype (dtype='auto' picks by CPU)")
    if name == "auto":
        support = features.bf16_support()
        if support:
            return Choice("bf16", torch.bfloat16, f"dtype='auto': bf16 on {support}")
        return Choice("fp32", torch.float32, "dtype='auto': fp32, this CPU has no AMX-BF16 or AVX512-BF16")
    if name in QUANTIZED:
        return Choice(name, torch.float32, f"dtype={name!r} asked for", quantize=name)
    if name not in DTYPES:
        raise OptionError(
            f"{{name}} is not one of {TARGET_CHOICES} (or None to keep the model's dtype)", name=("dtype", dtype)
        )
    return _forced(name, "dtype", features)


def draft_choice(draft_precision: str | None, target: Choice, features: CPUFeatures) -> Choice:
    """The draft's precision; None follows the target's resolved choice."""
    name = _normalise(draft_precision)
    if name is None:
        return Choice(
            target.name, target.dtype, f"draft_precision not given: same as the target ({target.name})", target.quantize
        )
    if name in ("w8af32", *QUANTIZED):
        return Choice(name, torch.float32, f"draft_precision={name!r} asked for", quantize=name)
    if name not in DRAFT_CHOICES:
        raise OptionError(
            f"{{name}} is not one of {DRAFT_CHOICES} (or None)", name=("draft_precision", draft_precision)
        )
    return _forced(name, "draft_precision", features)

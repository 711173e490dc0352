"""The precision an EAGLE-3 head drafts in (`head_precision`, `--head-precision`), and its quantized copy.

| value   | the head's linear layers (fc, q/k/v/o, gate/up/down, lm_head)       | the rest (norms, attention, cache) |
|---------|----------------------------------------------------------------------|------------------------------------|
| "float" | the target's activation dtype (a published bf16 head copied once)   | the same                           |
| "bf16"  | bf16                                                                 | bf16                               |
| "int8"  | `QuantizedLinear` on the package's block kernels: Q8_0 blocks of 32  | fp32                               |
| "int4"  | the same, Q4_1 blocks of 32 (activations int8 per block in both)     | fp32                               |
| "auto"  | `AUTO_SCHEME` when the target's own quantized layers run on the package's kernels, else "float"           |

The tokens do not depend on it: only the target's logits decide them. The head's precision changes which tokens
it proposes (so acceptance) and its cost c, which the output layer (V_d × H) dominates. A layer whose input width
is not a multiple of 32 stays float. Where the kernels cannot run (`ASSISTED_BACKENDS_KERNELS=aten`, no AVX2, a
target off the CPU) an "int8"/"int4" head stays float and the choice says why. The copies themselves:
`drafters.eagle.copies`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from assisted_backends.native import extension
from assisted_backends.options.errors import OptionError

HEAD_PRECISIONS = ("auto", "float", "bf16", "int8", "int4")
SCHEMES = {"int8": 8, "int4": 4}  # bits of the block formats
AUTO_SCHEME = "int8"


class HeadPrecisionWarning(UserWarning):
    """An "int8"/"int4" head asked for runs in float (the package's kernels cannot run here)."""


@dataclass(frozen=True)
class HeadPrecision:
    """The precision a head drafts in: `name` ("float", "bf16", "int8" or "int4"), what was `requested`, and why."""

    name: str
    requested: str
    reason: str

    @property
    def quantized(self) -> bool:
        return self.name in SCHEMES

    @property
    def fell_back(self) -> bool:
        """Whether a quantized head was asked for by name and runs in float instead."""
        return self.requested in SCHEMES and not self.quantized

    def line(self) -> str:
        return f"EAGLE head: {self.name} ({self.reason})"


def check_head_precision(value: object, option: str = "head_precision") -> str:
    """`value` when it is one of HEAD_PRECISIONS, else an OptionError naming `option`."""
    if value not in HEAD_PRECISIONS:
        raise OptionError(
            f"{{name}} must be one of {', '.join(repr(p) for p in HEAD_PRECISIONS)}; 'auto' quantizes the head "
            "when the target runs on the package's kernels",
            name=(option, value),
        )
    return str(value)


def _why_no_kernels(device: torch.device) -> str:
    if device.type != "cpu":
        return f"the package's kernels run on the CPU and the target is on {device.type}"
    status = extension.status()
    return "" if status.available else f"the package's kernels cannot run here ({status.reason})"


def choose_precision(requested: str, target_kernels: frozenset[str], device: torch.device) -> HeadPrecision:
    """The precision a head asking for `requested` drafts in next to a target whose quantized layers run on
    `target_kernels` ({"blocks"}: the package's kernels; {"aten"}: PyTorch's; empty: a float target) on `device`."""
    requested = check_head_precision(requested)
    if requested in ("float", "bf16"):
        return HeadPrecision(requested, requested, f"head_precision={requested!r}")
    if requested == "auto" and "blocks" not in target_kernels:
        return HeadPrecision("float", requested, "auto: the target does not run on the package's block kernels")
    why_not = _why_no_kernels(device)
    if why_not:
        return HeadPrecision("float", requested, f"{requested} not possible: {why_not}")
    if requested == "auto":
        return HeadPrecision(AUTO_SCHEME, requested, "auto: the target runs on the package's block kernels")
    return HeadPrecision(requested, requested, f"head_precision={requested!r}, on the package's block kernels")


def warn_if_fell_back(choice: HeadPrecision) -> None:
    """A HeadPrecisionWarning when a quantized head asked for by name runs in float."""
    if choice.fell_back:
        warnings.warn(f"head_precision={choice.requested!r}: {choice.reason}; the head drafts in float",
                      HeadPrecisionWarning, stacklevel=3)  # fmt: skip

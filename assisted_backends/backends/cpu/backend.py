"""CPU backend: the reference path CI runs everywhere, and the Xeon-aware path where asked.

- `dtype=None` keeps the model's dtype (the reference path: nothing is cast or rewritten);
  `dtype="auto"` runs the target in bf16 where the CPU has AMX-BF16 or AVX512-BF16, fp32 elsewhere;
  `"fp32"`, `"bf16"`, `"fp16"` force one and are refused where they would be emulated.
- `draft_precision`: None (as the target), `"fp32"`, `"bf16"` or `"w8af32"` (int8 linear weights,
  fp32 activations; `assisted_backends/backends/cpu/quantize.py`).
- intel-extension-for-pytorch where it loads (`ASSISTED_BACKENDS_IPEX=auto|on|off`, backends/cpu/ipex.py).
- `describe()` reports what was chosen and why, and the threads and CPU affinity the process got.

`prepare` casts the target in place (as `model.to(dtype)` does); a draft that needs another dtype or
quantization becomes a copy, kept per model, so the user's draft (which may be the target itself)
is never altered. Calling `prepare` again returns the same prepared model.
"""

from __future__ import annotations

import copy
import resource
import sys
from weakref import WeakKeyDictionary

import torch

from assisted_backends.backends.base import Backend, ModelRole, dtype_name
from assisted_backends.backends.cpu import affinity, cpu_features, ipex, precision, quantize

PREPARED_ATTRIBUTE = "_assisted_backends_cpu"  # the preparation a model already went through
_COPIES: WeakKeyDictionary[torch.nn.Module, dict[tuple, torch.nn.Module]] = WeakKeyDictionary()
_CAST_FROM: WeakKeyDictionary[torch.nn.Module, torch.dtype] = WeakKeyDictionary()  # dtype before our in-place cast


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    parameter = next(model.parameters(), None)
    return parameter.dtype if parameter is not None else torch.float32


class CPUBackend(Backend):
    name = "cpu"
    priority = 0
    head_on_demand = True  # measured: Gemma 3 270M fp32, a head over 11 positions costs 2.5x one over 1

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.features = cpu_features.detect()
        self.target_precision = precision.target_choice(self.options.dtype, self.features)
        self.draft_precision = precision.draft_choice(
            self.options.draft_precision, self.target_precision, self.features
        )
        if self.draft_precision.quantize:
            quantize.check_supported()
        self.ipex_mode = ipex.requested_mode()
        self.ipex_status = ipex.status() if self.ipex_mode != "off" else None
        if self.ipex_mode == "on":
            ipex.wanted("on", None, self.ipex_status)  # fail now, not after loading the models
        self._chosen: dict[str, dict[str, str]] = {}
        self._warned = False

    @classmethod
    def is_available(cls) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def _choice(self, role: ModelRole) -> precision.Choice:
        return self.target_precision if role == "target" else self.draft_precision

    def prepare(self, model: torch.nn.Module, role: ModelRole) -> torch.nn.Module:
        if not self._warned:
            affinity.warn_if_oversubscribed()
            self._warned = True
        choice = self._choice(role)
        current = _model_dtype(model)
        if choice.quantize:
            use_ipex, ipex_reason = False, "not used: w8af32 runs on PyTorch's int8 kernels"
            dtype = torch.float32
        else:
            dtype = choice.dtype or current
            use_ipex, ipex_reason = ipex.wanted(self.ipex_mode, dtype, self.ipex_status)
        label = f"w8af32[{quantize.DEFAULT_METHOD}]" if choice.quantize else dtype_name(dtype)
        signature = (label, use_ipex)
        self._chosen[role] = {
            "precision": label,
            "reason": choice.reason if choice.dtype is not None else f"{choice.reason}: {dtype_name(current)}",
            "ipex": ipex_reason,
        }
        previous = getattr(model, PREPARED_ATTRIBUTE, None)
        if previous == signature:
            return model
        cached = _COPIES.get(model, {}).get(signature)
        if cached is not None:
            return cached

        if previous is not None and previous[1]:
            raise ValueError(
                f"this model was rewritten in place by intel-extension-for-pytorch ({previous[0]}), so it cannot "
                f"also run as {label}: load it again, or pass a separate draft model"
            )
        needs_copy = choice.quantize or (role == "draft" and (dtype != current or use_ipex))
        if needs_copy:
            prepared = self._prepared_copy(model, choice, dtype)
            _COPIES.setdefault(model, {})[signature] = prepared
        else:
            prepared = self._prepared_in_place(model, dtype, current)
        if use_ipex:
            prepared = ipex.optimize(prepared, dtype)
        setattr(prepared, PREPARED_ATTRIBUTE, signature)
        return prepared

    def _prepared_copy(self, model: torch.nn.Module, choice: precision.Choice, dtype: torch.dtype) -> torch.nn.Module:
        if choice.quantize:
            if quantize.is_quantized(model):
                raise ValueError("this draft is already w8af32-quantized: pass the original draft model")
            return quantize.quantize_w8af32(model.to(self.device))
        return copy.deepcopy(model).to(self.device, dtype).eval()

    def _prepared_in_place(self, model: torch.nn.Module, dtype: torch.dtype, current: torch.dtype) -> torch.nn.Module:
        original = _CAST_FROM.get(model)
        if original is not None and torch.finfo(dtype).bits > torch.finfo(current).bits:
            raise ValueError(
                f"this model was cast in place from {original} to {current} by an earlier call; its {original} "
                f"weights are gone. Load it again (or keep a copy) to run it in {dtype}"
            )
        if dtype != current:
            _CAST_FROM.setdefault(model, current)
        return model.to(self.device, dtype).eval()

    def memory_stats(self) -> dict[str, int]:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scale = 1 if sys.platform == "darwin" else 1024  # Linux reports KiB
        return {"peak_rss_bytes": int(peak * scale)}

    def describe(self) -> dict[str, str]:
        """What was chosen and why (precision, IPEX) and the threads and CPUs this process actually got."""
        report = {"backend": self.name, "device": str(self.device), "cpu": self.features.summary()}
        for role in ("target", "draft"):
            chosen = self._chosen.get(role)
            choice = self._choice(role)
            key = "dtype" if role == "target" else "draft_precision"
            if chosen is None:  # not prepared yet: what will be chosen
                report[key] = "w8af32" if choice.quantize else (dtype_name(choice.dtype) if choice.dtype else "model")
                report[f"{key}_reason"] = choice.reason
                continue
            report[key] = chosen["precision"]
            report[f"{key}_reason"] = chosen["reason"]
            report[f"ipex_{role}"] = chosen["ipex"]
        if self.ipex_status is None:
            report["ipex"] = f"off ({ipex.ENV}=off)"
        else:
            report["ipex"] = f"{ipex.ENV}={self.ipex_mode}; {self.ipex_status.reason}"
        report.update(affinity.placement().as_dict())
        return report

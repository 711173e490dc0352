"""CPU backend: the reference path CI runs everywhere, and the Xeon-aware path where asked.

- `dtype=None` keeps the model's dtype (the reference path: nothing is cast or rewritten);
  `dtype="auto"` runs the target in bf16 where the CPU has AMX-BF16 or AVX512-BF16, fp32 elsewhere;
  `"fp32"`, `"bf16"`, `"fp16"` force one and are refused where they would be emulated.
- `dtype="int8"` / `"int4"`: weight-only quantized linear layers (`quantized.linear`), the model
  quantized in place; a model that came quantized (a `.gguf` file) keeps its weights. Quantized targets
  get batch-invariant attention (`invariant_attention`), so a verify pass computes the logits the
  one-token steps would, bit for bit.
- `draft_precision`: None (as the target), `"fp32"`, `"bf16"`, `"int8"`, `"int4"` or `"w8af32"` (int8
  linear weights, fp32 activations; `quantize.py`), on a copy of the draft.
- intel-extension-for-pytorch where it loads (`ASSISTED_BACKENDS_IPEX=auto|on|off`, backends/cpu/ipex.py).
- `describe()` reports what was chosen and why, and the threads and CPU affinity the process got.

`prepare` casts the target in place (as `model.to(dtype)` does); a draft that needs another dtype or
quantization becomes a copy, kept per model, so the user's draft (which may be the target itself)
is never altered. Calling `prepare` again returns the same prepared model.
"""

from __future__ import annotations

import copy
import functools
import os
import resource
import sys
from weakref import WeakKeyDictionary

import torch

from assisted_backends import hf_compat
from assisted_backends.backends.base import Backend, ModelRole, dtype_name
from assisted_backends.backends.cpu import affinity, cpu_features, invariant_attention, ipex, precision, quantize
from assisted_backends.quantized import kernels
from assisted_backends.quantized.fusion import fuse_projections
from assisted_backends.quantized.linear import QUANTIZED_MARKER, kernel_report, quantize_model, quantized_scheme

PREPARED_ATTRIBUTE = "_assisted_backends_cpu"  # the preparation a model already went through
VERIFY_ATTRIBUTE = "_assisted_backends_verify"  # a quantized target's attention and verify-pass invariance
_COPIES: WeakKeyDictionary[torch.nn.Module, dict[tuple, torch.nn.Module]] = WeakKeyDictionary()
_CAST_FROM: WeakKeyDictionary[torch.nn.Module, torch.dtype] = WeakKeyDictionary()  # dtype before our in-place cast


def _label(choice: precision.Choice, loaded: str | None, dtype: torch.dtype) -> str:
    """The precision a prepared model runs in, as the report names it."""
    if choice.quantize == "w8af32":
        return f"w8af32[{quantize.DEFAULT_METHOD}]"
    if loaded and not choice.quantize:
        return f"{loaded} (as loaded)"
    return choice.quantize or dtype_name(dtype)


@functools.cache
def _precisions(
    dtype: str | None, draft_precision: str | None, cpuinfo: str | None
) -> tuple[cpu_features.CPUFeatures, precision.Choice, precision.Choice]:
    """The CPU's features (read from `cpuinfo`, else /proc/cpuinfo) and the target's and the draft's precision:
    worked out once per process for each set of arguments (a refusal raises every time)."""
    features = cpu_features.detect(cpuinfo)
    target = precision.target_choice(dtype, features)
    return features, target, precision.draft_choice(draft_precision, target, features)


def _quantized(model: torch.nn.Module, scheme: str) -> torch.nn.Module:
    """`model` with its linear layers quantized; the input embedding too when the LM head shares its weight (the
    head then reads the quantized table every step), else it stays float (a step reads only its gathered rows)."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and getattr(head, "weight", None) is getattr(embedding, "weight", False)
    quantized = quantize_model(model, scheme, embeddings=tied)
    fuse_projections(quantized)  # q/k/v and gate/up in one kernel call each (the same bits)
    return quantized


class CPUBackend(Backend):
    name = "cpu"
    priority = 0
    head_on_demand = True  # a head over many positions costs a multiple of one over 1 (RESULTS.md: Gemma 3)

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.features, self.target_precision, self.draft_precision = _precisions(
            self.options.dtype, self.options.draft_precision, os.environ.get(cpu_features.CPUINFO_ENV)
        )
        if self.draft_precision.quantize == "w8af32":
            quantize.check_supported()
        for choice in (self.target_precision, self.draft_precision):
            if choice.quantize in ("int8", "int4"):
                missing = kernels.available().missing(choice.quantize)
                if missing:
                    raise NotImplementedError(f"{choice.name} weights need PyTorch's CPU kernel: {missing}")
        self.ipex_mode = ipex.mode_of(os.environ.get(ipex.ENV))
        self._ipex_status: ipex.IpexStatus | None = None
        if self.ipex_mode == "on":
            ipex.wanted("on", None, self.ipex_status)  # fail now, not after loading the models
        self._chosen: dict[str, dict[str, str]] = {}

    @classmethod
    def is_available(cls) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def ipex_status(self) -> ipex.IpexStatus | None:
        """Whether IPEX can load here (None when ASSISTED_BACKENDS_IPEX=off), looked up when first asked."""
        if self._ipex_status is None and self.ipex_mode != "off":
            self._ipex_status = ipex.status()
        return self._ipex_status

    def _choice(self, role: ModelRole) -> precision.Choice:
        return self.target_precision if role == "target" else self.draft_precision

    def prepare(self, model: torch.nn.Module, role: ModelRole) -> torch.nn.Module:
        affinity.warn_once_if_oversubscribed(torch.get_num_threads())
        choice = self._choice(role)
        current = hf_compat.activation_dtype(model)
        # weights that came quantized (a .gguf file) stay so
        loaded = quantized_scheme(model) if hasattr(model, QUANTIZED_MARKER) else None
        if choice.quantize or loaded:
            use_ipex, ipex_reason = False, "not used: quantized weights run on PyTorch's int8/int4 kernels"
            dtype = torch.float32
        else:
            dtype = choice.dtype or current
            use_ipex, ipex_reason = ipex.native(self.ipex_mode, dtype) or ipex.wanted(
                self.ipex_mode, dtype, self.ipex_status
            )
        label = _label(choice, loaded, dtype)
        signature = (label, use_ipex)
        reason = choice.reason if (choice.dtype is not None or loaded) else f"{choice.reason}: {dtype_name(current)}"
        self._chosen[role] = {"precision": label, "reason": reason, "ipex": ipex_reason}
        previous = getattr(model, PREPARED_ATTRIBUTE, None)
        if previous == signature:
            self._chosen[role].update(getattr(model, VERIFY_ATTRIBUTE, {}))
            if loaded:
                self._chosen[role]["kernels"] = kernel_report(model)
            return model
        cached = _COPIES.get(model, {}).get(signature)
        if cached is not None:
            return cached

        if previous is not None and previous[1]:
            raise ValueError(
                f"this model was rewritten in place by intel-extension-for-pytorch ({previous[0]}), so it cannot "
                f"also run as {label}: load it again, or pass a separate draft model"
            )
        if role == "draft" and (choice.quantize or dtype != current or use_ipex):
            prepared = self._prepared_copy(model, choice, dtype)
            _COPIES.setdefault(model, {})[signature] = prepared
        elif choice.quantize and not loaded:
            prepared = self._quantized_in_place(model, choice.quantize)
        elif loaded:
            prepared = model.to(self.device).eval()  # its float parts stay as they came
        else:
            prepared = self._prepared_in_place(model, dtype, current)
        if use_ipex:
            prepared = ipex.optimize(prepared, dtype)
        if role == "target" and quantized_scheme(prepared):
            # its weight kernels are batch-invariant: attention row by row makes the verify pass so too
            enabled = invariant_attention.enable(prepared)
            refused = invariant_attention.supported(prepared) or "the model does not switch attention implementations"
            difference = invariant_attention.verify_pass_difference(prepared)
            setattr(prepared, VERIFY_ATTRIBUTE, {
                "attention": "batch-invariant" if enabled else refused,
                "verify_pass": difference or "bit-identical to one-token steps",
            })  # fmt: skip
        self._chosen[role].update(getattr(prepared, VERIFY_ATTRIBUTE, {}))
        if quantized_scheme(prepared):
            self._chosen[role]["kernels"] = kernel_report(prepared)
        setattr(prepared, PREPARED_ATTRIBUTE, signature)
        return prepared

    def _prepared_copy(self, model: torch.nn.Module, choice: precision.Choice, dtype: torch.dtype) -> torch.nn.Module:
        if choice.quantize == "w8af32":
            if quantize.is_quantized(model):
                raise ValueError("this draft is already w8af32-quantized: pass the original draft model")
            return quantize.quantize_w8af32(model.to(self.device))
        if choice.quantize:
            return _quantized(copy.deepcopy(model).to(self.device, torch.float32).eval(), choice.quantize)
        return copy.deepcopy(model).to(self.device, dtype).eval()

    def _quantized_in_place(self, model: torch.nn.Module, scheme: str) -> torch.nn.Module:
        """The target's linear layers (and embedding) quantized in place, as a dtype cast is done in place."""
        _CAST_FROM.setdefault(model, hf_compat.activation_dtype(model))
        return _quantized(model.to(self.device, torch.float32).eval(), scheme)

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
                report[key] = choice.quantize or (dtype_name(choice.dtype) if choice.dtype else "model")
                report[f"{key}_reason"] = choice.reason
                continue
            report[key] = chosen["precision"]
            report[f"{key}_reason"] = chosen["reason"]
            report[f"ipex_{role}"] = chosen["ipex"]
            for key in ("attention", "verify_pass", "kernels"):
                if key in chosen:
                    report[f"{role}_{key}"] = chosen[key]
        if self.ipex_status is None:
            report["ipex"] = f"off ({ipex.ENV}=off)"
        else:
            report["ipex"] = f"{ipex.ENV}={self.ipex_mode}; {self.ipex_status.reason}"
        report.update(affinity.placement().as_dict())
        return report

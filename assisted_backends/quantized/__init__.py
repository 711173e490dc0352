"""Weight-only quantized linear layers, and GGUF loading that keeps the weights quantized on CPU.

Modules (one job each), bottom floor first (`tests/project/test_floors.py` keeps the stack at most 5 high):
`kernels` (which PyTorch CPU kernels exist and what they compute), `weights` (the one interface every weight
format implements), `rounding` (scales rounded up to their stored dtype), `gguf_fields` (the bit fields inside GGUF
blocks), `gguf_header` (the package's one GGUF header reader, torch-free), `cache` (where repacked weights are
kept); `int4_layout` (reading rows back out of the int4 kernel's packed layout), `blocks` (weights in the package's
kernels' layout), `file_checks`; `packing` (weights in PyTorch's kernels' layouts), `fusion` (sibling projections
in one call), `finite_values`, `hf_config` (the transformers config of a GGUF file); `formats` (the formats by
name), `linear` (`QuantizedLinear`, `QuantizedEmbedding`, `quantize_model`), `gguf` (GGUF blocks -> kernel
layouts, what is exact and what is rounded); `model` (`load_gguf_quantized`). The native decoder's step over these
layers (`NativeCausalLM`) is `native.decoder_model`. Vendor packages (`gguf`, `safetensors`, `accelerate`) are
imported only where used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "QuantizedLinear": "linear",
    "QuantizedEmbedding": "linear",
    "quantize_model": "linear",
    "load_gguf_quantized": "model",
    "LoadedGGUF": "model",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

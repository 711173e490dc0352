"""Weight-only quantized linear layers, and GGUF loading that keeps the weights quantized on CPU.

Modules (one job each): `kernels` (which PyTorch CPU kernels exist and what they compute),
`int4_layout` (reading rows back out of the int4 kernel's packed layout), `packing` (weights in
PyTorch's kernels' layouts), `blocks` (weights in the package's kernels' layout), `weights` (the one
interface every weight format implements, and the formats), `linear` (`QuantizedLinear`,
`QuantizedEmbedding`, `quantize_model`), `gguf` (GGUF blocks -> kernel layouts, what is exact and what
is rounded), `gguf_header` (the package's one GGUF header reader, torch-free), `hf_config` (the
transformers config of a GGUF file), `cache` (where repacked weights are kept), `model`
(`load_gguf_quantized`), `fusion` (sibling projections in one call), `native_decoder` (`NativeCausalLM`). Vendor
packages (`gguf`, `safetensors`, `accelerate`) are imported only where used.
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

"""Weight-only quantized linear layers and GGUF loading that keeps weights quantized on CPU.

Modules (one job each): `kernels` (which PyTorch CPU kernels exist and what they compute),
`int4_layout` (reading rows back out of the int4 kernel's packed layout), `linear`
(`QuantizedLinear`, `QuantizedEmbedding`, `quantize_model`), `gguf` (GGUF blocks -> kernel layouts),
`model` (`load_gguf_quantized`). Vendor packages (`gguf`, `safetensors`) are imported lazily.
"""

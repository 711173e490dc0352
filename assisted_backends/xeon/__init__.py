"""Xeon-aware pieces of the CPU backend: capability detection, draft quantization, IPEX, thread affinity.

Nothing here imports a vendor library at import time; `ipex.py` imports intel_extension_for_pytorch
only when asked to use it, and only after checking that it can load into this torch.
"""

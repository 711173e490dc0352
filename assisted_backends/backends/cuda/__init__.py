"""The CUDA backend and its helpers (graph capture)."""

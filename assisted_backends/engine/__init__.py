"""The decoding engine: prefill -> [draft γ -> verify γ+1 -> accept -> commit/rollback]*, and what it touches."""

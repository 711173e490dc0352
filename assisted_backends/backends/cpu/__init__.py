"""The CPU backend and its helpers (CPU features, precision, int8 drafts, IPEX, threads and affinity)."""

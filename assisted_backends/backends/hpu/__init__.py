"""The Gaudi (HPU) backend and its helpers (optimum-habana)."""

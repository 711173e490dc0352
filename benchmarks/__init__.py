"""Benchmarks of assisted_backends: run each one from the repository root as `python -m benchmarks.<name>`.

The shared pieces (interleaved timing, step timing, result files, model loading, the expected-speedup
formulas) live in `benchmarks.harness`; each script holds its case table and what is specific to it.
"""

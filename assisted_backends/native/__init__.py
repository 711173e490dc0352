"""The package's C++ code: the batch-invariant block kernels and row attention (`csrc/`), built on first use
and cached per CPU (`extension`)."""

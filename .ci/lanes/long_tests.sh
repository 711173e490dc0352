#!/usr/bin/env bash
# Long tests lane: the statistical and sweep tests marked `slow` (chi-square sampling checks, the
# sliding-window sampling run, the shape census), which the README's default test command deselects.
#   .ci/lanes/long_tests.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python}
source .ci/pytest_lane.sh
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} run_pytest "$python" -q -m slow "$@"

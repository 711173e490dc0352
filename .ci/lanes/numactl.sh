#!/usr/bin/env bash
# numactl lane: installs numactl from Debian's packages (a few seconds) and runs the pinned-run
# tests: the affinity report under numactl, taskset and torch's Xeon launcher, and the CLI pinned
# with each launcher. With ASSISTED_BACKENDS_NUMACTL_LANE=1 the numactl tests fail instead of skipping.
#   .ci/lanes/numactl.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python}
if ! command -v numactl >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends numactl
fi
numactl --show

export ASSISTED_BACKENDS_NUMACTL_LANE=1
source .ci/pytest_lane.sh
run_pytest "$python" -q -rs tests/backends/test_xeon_affinity.py "$@"

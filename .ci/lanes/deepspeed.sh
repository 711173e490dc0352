#!/usr/bin/env bash
# DeepSpeed lane: installs deepspeed 0.19.8 into the main environment (about 30 s on top of torch 2.13)
# and runs the tests that need it: 2 CPU ranks (gloo) under torch.distributed.run, DeepSpeed AutoTP
# sharding the target, token identity with the single-process run; the rank-agreement stress test
# (20 consecutive 2-rank CLI launches beside a busy process, greedy adaptive and seeded sampling),
# the API under torchrun, and a stalled rank ending the run within ASSISTED_BACKENDS_COLLECTIVE_TIMEOUT_S.
# About 25 launches of ~12 s of CPU each: 5-7 minutes on 2 idle cores (much more on a shared, busy machine).
# ASSISTED_BACKENDS_STRESS_LAUNCHES=N changes the number of stress launches (20 by default).
#   .ci/lanes/deepspeed.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python}
"$python" -m pip install -q "deepspeed==0.19.8"
"$python" -c "import deepspeed; print('deepspeed', deepspeed.__version__)"

export DS_ACCELERATOR=cpu
export ASSISTED_BACKENDS_DEEPSPEED_LANE=1  # the tests fail instead of skipping if deepspeed is missing
source .ci/pytest_lane.sh
run_pytest "$python" -q -rs tests/distributed "$@"

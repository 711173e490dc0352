#!/usr/bin/env bash
# DeepSpeed lane: installs deepspeed 0.19.8 into the main environment (about 30 s on top of torch 2.13)
# and runs the tests that need it: 2 CPU ranks (gloo) under torch.distributed.run, DeepSpeed AutoTP
# sharding the target, token identity with the single-process run. About 1-2 minutes.
#   .ci/lanes/deepspeed.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python}
"$python" -m pip install -q "deepspeed==0.19.8"
"$python" -c "import deepspeed; print('deepspeed', deepspeed.__version__)"

export DS_ACCELERATOR=cpu
export ASSISTED_BACKENDS_DEEPSPEED_LANE=1  # the tests fail instead of skipping if deepspeed is missing
source .ci/pytest_lane.sh
run_pytest "$python" -q -rs tests/test_deepspeed_*.py "$@"

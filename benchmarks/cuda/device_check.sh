#!/usr/bin/env bash
# One session's checks on a lent NVIDIA GPU, in one command (each step time-boxed; a failed step does not
# stop the next). Writes logs and JSON under $OUT (default: ./cuda_out):
#   bash benchmarks/cuda/device_check.sh
# 1. the CUDA tests (real GPU, real CUDA graphs; suffix trees and the serving loop on the GPU) and the graph
#    bookkeeping tests;
# 2. the README's main job on the GPU (--device cuda);
# 3. benchmarks/cuda_assisted.py: the random 1B-parameter Llama pair (mechanics) and the demo pair on a
#    real prompt, each in bf16 and fp32 (fp32: token identity expected everywhere).
set -uo pipefail
OUT=${OUT:-./cuda_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python=${PYTHON:-python3}
{  # the machine, at the head of the test log (at most 8 files come back)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$OUT/tests.log"
"$python" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || export PYTHONPATH=$PWD
demo=assisted_backends/demo/weights
step() {  # step SECONDS NAME COMMAND...
  local seconds=$1 name=$2
  shift 2
  echo "+ $*"
  local start=$SECONDS
  local log=/tmp/$name.log
  case $name in tests | main_job) log=$OUT/$name.log ;; esac  # at most 8 files come back; benchmarks write JSON
  timeout "$seconds" "$@" 2>&1 | tee -a "$log" | grep -v -E "Loading weights|^\[transformers\]|it/s\]"
  echo "= $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s"
}
step 170 tests "$python" -m pytest -q -p no:cacheprovider -rs tests/backends/test_cuda_gpu.py tests/backends/test_cuda_graphs.py tests/backends/test_cuda_backend.py \
  tests/backends/test_cuda_serving.py
step 75 main_job "$python" -m assisted_backends.cli --task benchmark --compare --quick --device cuda
step 120 bench_random_bf16 "$python" -m benchmarks.cuda_assisted --dtype bf16 --repeats ${REPEATS:-5} --json "$OUT/cuda_assisted.json"
step 120 bench_random_fp32 "$python" -m benchmarks.cuda_assisted --dtype fp32 --repeats ${REPEATS:-5} --json "$OUT/cuda_assisted_fp32.json"
step 60 bench_demo_bf16 "$python" -m benchmarks.cuda_assisted --target $demo/target --draft $demo/draft --dtype bf16 \
  --prompt $'def parse_args(argv):\n    ' --repeats ${REPEATS:-5} --json "$OUT/cuda_assisted_demo_bf16.json"
step 60 bench_demo_fp32 "$python" -m benchmarks.cuda_assisted --target $demo/target --draft $demo/draft --dtype fp32 \
  --prompt $'def parse_args(argv):\n    ' --repeats ${REPEATS:-5} --json "$OUT/cuda_assisted_demo_fp32.json"

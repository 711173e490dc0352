#!/usr/bin/env bash
# The package's CPU kernels on the CPU at hand, in one command (for a machine met once, such as a lent GPU
# machine's host): its instruction-set flags, the kernel tests (every path this CPU runs bit for bit, the others
# refused by flag), where the CPU has AMX its tiles against the AVX-512 VNNI tile at 1 thread and every core
# (`benchmarks.block_kernels --paths`, 1.5B layer shapes), and `benchmarks.thread_scaling` from 1 thread to every
# core. Writes $OUT/cpu_kernels.log, $OUT/block_kernels_paths.json and $OUT/thread_scaling.json (default OUT:
# ./cpu_out):
#   bash benchmarks/cpu_check.sh
set -uo pipefail
OUT=${OUT:-./cpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
log=$OUT/cpu_kernels.log
cores=$(nproc)
{
  lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket|^L3|^NUMA node\(s\)"
  echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|avx512_bf16|gfni|amx_[a-z0-9]+)$' | tr '\n' ' ')"
} 2>&1 | tee "$log"
start=$SECONDS
timeout "${TEST_SECONDS:-300}" "$python" -m pytest -q -p no:cacheprovider -rs tests/quantized/test_block_kernels.py \
  tests/quantized/test_bit_planes.py tests/native/test_isa_selection.py tests/native/test_kernel_invariance.py 2>&1 |
  tee -a "$log" | tail -4
echo "= kernel tests: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"
if "$python" -c "from assisted_backends.native import extension as e; raise SystemExit('amx' not in e.runnable_isas())"; then
  start=$SECONDS
  timeout "${PATHS_SECONDS:-180}" "$python" -m benchmarks.block_kernels --paths avx512vnni amx --sizes 1.5B --no-aten \
    --formats Q4_0 Q4_K Q6_K Q8_0 --threads 1 "$cores" --repeats "${ROUNDS:-3}" --out "$OUT/block_kernels_paths.json" 2>&1 |
    tee -a "$log"
  echo "= AMX against AVX-512 VNNI: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"
fi
counts="1 2"
for t in 4 8 16 32 64; do [ "$t" -lt "$cores" ] && counts="$counts $t"; done
[ "$cores" -gt 2 ] && counts="$counts $cores"
start=$SECONDS
timeout "${SCALING_SECONDS:-240}" "$python" -m benchmarks.thread_scaling --rounds "${ROUNDS:-3}" --threads $counts \
  --out "$OUT/thread_scaling.json" 2>&1 | tee -a "$log"
echo "= thread scaling ($counts): exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"

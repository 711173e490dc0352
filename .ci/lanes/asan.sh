#!/usr/bin/env bash
# AddressSanitizer lane (issue 49): the package's kernels and native decoder built with -fsanitize=address
# (ASSISTED_BACKENDS_SANITIZE=address: their own cache keys, beside the normal builds), Python run with the
# compiler's ASan runtime preloaded, and only what reaches the native code from a file or a direct call: the
# native tests (tests/native) and the GGUF fuzzer's default cases (tests/loading/test_gguf_fuzz.py, its worker
# and command-line children inherit the preload). An out-of-bounds read or write in the C++ is a report naming the
# line instead of silent corruption; any report fails the lane, also one from a child process whose exit a test
# expected (reports are written under $ASAN_REPORTS and checked at the end). Leak detection is off: CPython
# keeps its objects until exit by design. The first run builds the sanitized libraries (3-6 minutes on 2 cores),
# then about 3-5 minutes of tests (ASan's checks slow the native code about 2x).
#   .ci/lanes/asan.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python}
compiler=${CXX:-g++}
runtime=$("$compiler" -print-file-name=libasan.so)
# libstdc++ preloaded too: python does not link it, and ASan's __cxa_throw interceptor must find it at start-up
# (else the first C++ exception, e.g. a TORCH_CHECK, is "AddressSanitizer: CHECK failed ... real___cxa_throw")
stdcxx=$("$compiler" -print-file-name=libstdc++.so)
if [ ! -e "$runtime" ]; then
  echo "asan lane: $compiler has no AddressSanitizer runtime (libasan.so); install it (Debian: libasan8)" >&2
  exit 1
fi
reports=${ASAN_REPORTS:-$(mktemp -d "${TMPDIR:-/tmp}/asan-lane.XXXXXX")}
mkdir -p "$reports"
rm -f "$reports"/asan.*
echo "asan lane: runtime $runtime, reports under $reports"

export ASSISTED_BACKENDS_SANITIZE=address
# alloc_dealloc_mismatch / new_delete_type_mismatch: torch's and pybind11's allocations, not the package's code
options=(detect_leaks=0 halt_on_error=1 alloc_dealloc_mismatch=0 new_delete_type_mismatch=0 detect_odr_violation=0)
ASAN_OPTIONS=$(IFS=:; echo "${options[*]}"):log_path=$reports/asan
export ASAN_OPTIONS
export LD_PRELOAD="$runtime:$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export ASSISTED_BACKENDS_FUZZ_CASE_TIMEOUT=${ASSISTED_BACKENDS_FUZZ_CASE_TIMEOUT:-120}

source .ci/pytest_lane.sh
status=0
# test_freed_heap_pages_go_back measures glibc's malloc_trim, which ASan's own allocator replaces
run_pytest "$python" -q -rs -p no:cacheprovider -m "not slow" tests/native tests/loading/test_gguf_fuzz.py \
  --deselect tests/native/test_native_memory.py::test_freed_heap_pages_go_back "$@" || status=$?
unset LD_PRELOAD
found=$(find "$reports" -name 'asan.*' -type f | sort)
if [ -n "$found" ]; then
  for report in $found; do
    echo "=== AddressSanitizer report: $report" >&2
    cat "$report" >&2
  done
  echo "asan lane: $(echo "$found" | wc -l) AddressSanitizer report(s): failing the lane" >&2
  exit 1
fi
echo "asan lane: no AddressSanitizer report"
exit "$status"

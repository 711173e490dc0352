#!/usr/bin/env bash
# Run pytest with the given interpreter and arguments; exit with its status, except that exit code 5
# (no tests collected) is a failure. Sourced by .ci/run and .ci/lanes/*.sh:
#   run_pytest "$python" -q tests/...
run_pytest() {
  local python=$1
  shift
  local status
  set +e
  "$python" -m pytest "$@"
  status=$?
  set -e
  if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing the run" >&2
    return 1
  fi
  return "$status"
}

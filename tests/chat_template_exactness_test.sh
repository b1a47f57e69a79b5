#!/usr/bin/env bash
# `fusionrl chat-template` byte for byte against Python jinja2 set up as
# transformers' apply_chat_template sets it up
# (tests/chat_template/jinja2_reference.py; the driver is
# tests/chat_template/check_templates.py, which prints the counts and the
# first differences).
#
#   tests/chat_template_exactness_test.sh FUSIONRL_BINARY WORK_DIR MODE
#
# MODE conversations: 300 generated conversations through each chat template
#   we fetch (scripts/fetch-test-data.sh: Qwen3, Llama-3, Llama-3.1,
#   Qwen2.5, DeepSeek-V3, Gemma 3) and the
#   command's own contract (a bad line, a missing template).
# MODE probes: every probe of tests/chat_template/probes.jsonl (small
#   templates on jinja2's scoping, filters, tests, str / dict methods,
#   whitespace control and errors): same text, or both refuse; and 60
#   conversations through tests/chat_template/context_model (tools /
#   documents None, the special tokens transformers passes).
# Needs /usr/bin/python3 with jinja2 (Debian's python3-jinja2) and, for
# conversations, the fetched data. Without them it skips (exit 77, ctest's
# SKIP_RETURN_CODE), or fails under FUSIONRL_REQUIRE_ALL_TESTS=1 (CI), where a
# skip would hide a lost check.
set -euo pipefail

BIN=${1:?usage: chat_template_exactness_test.sh FUSIONRL_BINARY WORK_DIR MODE}
WORK=${2:?usage: chat_template_exactness_test.sh FUSIONRL_BINARY WORK_DIR MODE}
MODE=${3:?usage: chat_template_exactness_test.sh FUSIONRL_BINARY WORK_DIR MODE}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA="${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}"
PY=/usr/bin/python3  # Debian's: `python3` on PATH may lack jinja2
CHECK="$ROOT/tests/chat_template/check_templates.py"
MODELS=(qwen3 llama3 llama3_1 qwen2_5 deepseek_v3 gemma3)
mkdir -p "$WORK"

missing=""
"$PY" -c 'import jinja2' >/dev/null 2>&1 ||
  missing="$PY with jinja2 (apt-get install python3-jinja2)"
if [ "$MODE" = conversations ]; then
  for model in "${MODELS[@]}"; do
    f="$DATA/$model-tokenizer/tokenizer_config.json"
    [ -s "$f" ] || missing="$missing $f"
  done
fi
if [ -n "$missing" ]; then
  if [ "${FUSIONRL_REQUIRE_ALL_TESTS:-0}" = 1 ]; then
    echo "FAIL: missing $missing (FUSIONRL_REQUIRE_ALL_TESTS=1; run" \
         "scripts/install-deps.sh and scripts/fetch-test-data.sh)" >&2
    exit 1
  fi
  echo "SKIP: missing $missing; run scripts/install-deps.sh and" \
       "scripts/fetch-test-data.sh"
  exit 77  # ctest: Skipped (SKIP_RETURN_CODE), not Passed
fi

fail() { echo "FAIL: $*" >&2; exit 1; }

case "$MODE" in
  probes)
    rc=0
    TZ=UTC "$PY" "$CHECK" probes --probes "$ROOT/tests/chat_template/probes.jsonl" \
      --fusionrl "$BIN" --work "$WORK/probes" || rc=1
    # What apply_chat_template passes besides the messages (tools and
    # documents None, the special tokens), through a committed template.
    TZ=UTC "$PY" "$CHECK" conversations \
      --model "$ROOT/tests/chat_template/context_model" --label context \
      --fusionrl "$BIN" --work "$WORK/context" --count 60 --seed 1 || rc=1
    [ "$rc" = 0 ] || exit 1
    echo "PASS: every probe equals jinja2 (or both refuse)"
    ;;
  conversations)
    # The command's own contract: a bad line gets an error line naming it,
    # and a directory without a template exits 2.
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
    for model in "${MODELS[@]}"; do
      TZ=UTC "$PY" "$CHECK" conversations --model "$DATA/$model-tokenizer" \
        --label "$model" --fusionrl "$BIN" --work "$WORK/$model" \
        --count 300 --seed 1 || rc=1
    done
    [ "$rc" = 0 ] || exit 1
    echo "PASS: chat templates byte-exact against Python jinja2"
    ;;
  *)
    fail "MODE must be 'conversations' or 'probes', not '$MODE'"
    ;;
esac

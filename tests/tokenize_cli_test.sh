#!/usr/bin/env bash
# `fusionrl tokenize` end to end on Qwen3's tokenizer: encode, decode, a
# known id sequence from the golden file, and a bad input line (exit 2).
# Skips (exit 77, ctest's SKIP_RETURN_CODE) when the tokenizer has not been fetched
# (scripts/fetch-test-data.sh).
#
#   tests/tokenize_cli_test.sh FUSIONRL_BINARY
set -euo pipefail

BIN=${1:?usage: tokenize_cli_test.sh FUSIONRL_BINARY}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR="${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}/qwen3-tokenizer"

if [ ! -s "$DIR/tokenizer.json" ]; then
  echo "SKIP: Qwen3 tokenizer not found at $DIR; run scripts/fetch-test-data.sh"
  exit 77  # ctest: Skipped (SKIP_RETURN_CODE), not Passed
fi

fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. A known sequence from the golden file (reference ids).
printf '%s\n' '"<|im_start|>user\nhi<|im_end|>"' '"Hello world"' >"$tmp/in.jsonl"
"$BIN" tokenize --tokenizer "$DIR" <"$tmp/in.jsonl" >"$tmp/ids.jsonl" ||
  fail "encode exited $?"
want_chat=$(grep -F '"text":"<|im_start|>user\nhi<|im_end|>"' \
              "$ROOT/tests/data/tokenizer/qwen3_golden.jsonl" |
            sed -e 's/.*"ids"://' -e 's/}$//')
[ -n "$want_chat" ] || fail "golden file lacks the chat example"
[ "$(sed -n 1p "$tmp/ids.jsonl")" = "$want_chat" ] ||
  fail "chat ids $(sed -n 1p "$tmp/ids.jsonl") != golden $want_chat"
[ "$(sed -n 2p "$tmp/ids.jsonl")" = "[9707,1879]" ] ||
  fail "'Hello world' -> $(sed -n 2p "$tmp/ids.jsonl"), want [9707,1879]"

# 2. Round trip of assorted strings through encode and --decode.
cat >"$tmp/texts.jsonl" <<'EOF'
"Hello, world! It's 2024."
"  spaces\tand\ttabs\r\nCRLF\n\n"
"你好，世界！ こんにちは 안녕하세요"
"emoji 👩🏽‍💻 and flags 🇯🇵"
"<|im_start|>assistant\n<think>\nx = 42\n</think>\n\nDone.<|im_end|>"
"def f(x):\n    return x ** 2  # square"
""
EOF
"$BIN" tokenize --tokenizer "$DIR" <"$tmp/texts.jsonl" >"$tmp/texts.ids" ||
  fail "encode exited $?"
[ "$(wc -l <"$tmp/texts.ids")" -eq 7 ] || fail "expected 7 id lines"
"$BIN" tokenize --tokenizer "$DIR" --decode <"$tmp/texts.ids" >"$tmp/back.jsonl" ||
  fail "decode exited $?"
cmp -s "$tmp/texts.jsonl" "$tmp/back.jsonl" ||
  fail "round trip differs: $(diff "$tmp/texts.jsonl" "$tmp/back.jsonl" | head -5)"

# 3. A bad line: exit 2 and an error naming the line.
set +e
printf '%s\n' '"fine"' 'not json' | "$BIN" tokenize --tokenizer "$DIR" \
  >/dev/null 2>"$tmp/err"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "bad input exited $rc, want 2"
grep -q "line 2" "$tmp/err" || fail "error does not name line 2: $(cat "$tmp/err")"

set +e
printf '%s\n' '[1, "x"]' | "$BIN" tokenize --tokenizer "$DIR" --decode \
  >/dev/null 2>"$tmp/err"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "bad --decode input exited $rc, want 2"

# 4. A missing tokenizer directory: exit 2, naming tokenizer.json.
set +e
"$BIN" tokenize --tokenizer "$tmp/nowhere" </dev/null 2>"$tmp/err"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "missing tokenizer exited $rc, want 2"
grep -q "tokenizer.json" "$tmp/err" || fail "error does not name tokenizer.json"

echo "PASS: fusionrl tokenize"

#!/usr/bin/env bash
# Bad input to the CLI: each case must exit with code 2 and print one line
# naming the file, the key path and the reason. Usage: $0 FUSIONRL_BINARY
set -u
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0

# expect_error NAME EXPECTED_CODE "substring1|substring2|..." -- ARGS...
expect_error() {
  local name=$1 code=$2 patterns=$3; shift 4
  local out rc
  out=$(timeout 60 "$BIN" "$@" 2>&1 >/dev/null); rc=$?
  local ok=1
  [ "$rc" -eq "$code" ] || ok=0
  IFS='|' read -ra pats <<<"$patterns"
  for p in "${pats[@]}"; do
    grep -qF -- "$p" <<<"$out" || ok=0
  done
  local lines; lines=$(grep -c . <<<"$out")
  # Config errors are one line; CLI11 usage errors (no patterns) may add a hint.
  if [ "$code" -ne 0 ] && [ -n "$patterns" ] && [ "$lines" -ne 1 ]; then ok=0; fi
  if [ $ok -eq 1 ]; then
    pass=$((pass + 1)); echo "ok   $name"
  else
    fail=$((fail + 1)); echo "FAIL $name: exit $rc (want $code), output:"; echo "$out" | sed 's/^/     /'
  fi
}

write() { printf '%s\n' "$2" > "$TMP/$1"; }

write unknown.yaml $'rollout:\n  temprature: 0.5'
expect_error unknown_key 2 "unknown.yaml|rollout.temprature|unknown key|temperature" -- validate "$TMP/unknown.yaml"

write type.yaml $'rollout:\n  temperature: hot'
expect_error wrong_type 2 "type.yaml|rollout.temperature|expected a number" -- validate "$TMP/type.yaml"

write range.yaml $'rollout:\n  top_p: 1.5'
expect_error out_of_range 2 "range.yaml|rollout.top_p|(0, 1]" -- validate "$TMP/range.yaml"

write enum.yaml $'algorithm:\n  adv_estimator: ppo2'
expect_error bad_enum 2 "enum.yaml|algorithm.adv_estimator|grpo" -- validate "$TMP/enum.yaml"

write ckpt.yaml $'init_checkpoint: /nonexistent/ckpt'
expect_error missing_checkpoint 2 "ckpt.yaml|init_checkpoint|/nonexistent/ckpt" -- run "$TMP/ckpt.yaml"

write syntax.yaml $'model:\n  d_model: [1, 2'
expect_error yaml_syntax 2 "syntax.yaml|invalid YAML" -- run "$TMP/syntax.yaml"

expect_error missing_file 2 "no-such-job.yaml|cannot open" -- run "$TMP/no-such-job.yaml"
: > "$TMP/empty.yaml"
expect_error empty_file 2 "empty.yaml|the file is empty (no keys)" -- run "$TMP/empty.yaml"
write comments.yaml $'# nothing but a comment\n'
expect_error comments_only_file 2 "comments.yaml|the file is empty (no keys)" -- validate "$TMP/comments.yaml"
write lag.yaml $'placement:\n  mode: fused\nstalesync:\n  max_policy_lag: 2'
expect_error lag_without_decoupled 2 "lag.yaml|stalesync.max_policy_lag|algorithm.decoupled_loss: true" -- validate "$TMP/lag.yaml"
write weight_mode.yaml $'algorithm:\n  behaviour_weight_mode: clip'
expect_error bad_weight_mode 2 "weight_mode.yaml|algorithm.behaviour_weight_mode|truncate, mask" -- validate "$TMP/weight_mode.yaml"
expect_error bad_override 2 "--set rollout.temprature=0.7|unknown key" -- validate "$HERE/data/tiny.yaml" --set rollout.temprature=0.7
expect_error override_syntax 2 "--set nonsense|key.path=value" -- validate "$HERE/data/tiny.yaml" --set nonsense
expect_error override_range 2 "model.d_model|divisible" -- validate "$HERE/data/tiny.yaml" --set model.d_model=33
expect_error unknown_task 2 "task.name|unknown task 'nope'" -- run "$HERE/data/tiny.yaml" --set task.name=nope --output-dir "$TMP/out"
expect_error jsonl_missing 2 "task.train_path|/nonexistent.jsonl" -- run "$HERE/data/tiny.yaml" --set task.name=jsonl --set task.train_path=/nonexistent.jsonl
expect_error cli_usage 2 "" -- run
expect_error bench_mode 2 "unknown mode 'nope'" -- bench "$HERE/data/tiny.yaml" --modes colocated-sync,nope
expect_error good_config 0 "" -- validate "$HERE/data/tiny.yaml"

# Every command that reads a job file reports a bad one the same way: exit 2,
# one line naming the file and the key, before any work (or network wait).
expect_error sft_unknown_key 2 "unknown.yaml|rollout.temprature|unknown key" -- sft "$TMP/unknown.yaml" --output-dir "$TMP/sft"
expect_error sft_wrong_type 2 "type.yaml|rollout.temperature|expected a number" -- sft "$TMP/type.yaml" --output-dir "$TMP/sft"
expect_error eval_unknown_key 2 "unknown.yaml|rollout.temprature|unknown key" -- eval "$TMP/unknown.yaml" --checkpoint "$TMP/no-ckpt"
expect_error eval_wrong_type 2 "type.yaml|rollout.temperature|expected a number" -- eval "$TMP/type.yaml" --checkpoint "$TMP/no-ckpt"
expect_error bench_memory_unknown_key 2 "unknown.yaml|rollout.temprature|unknown key" -- bench-memory "$TMP/unknown.yaml" --out "$TMP/bm.json"
expect_error bench_memory_wrong_type 2 "type.yaml|rollout.temperature|expected a number" -- bench-memory "$TMP/type.yaml" --out "$TMP/bm.json"
expect_error bench_memory_bad_override 2 "--set model.moe_experts=many|model.moe_experts" -- bench-memory "$HERE/data/tiny.yaml" --set model.moe_experts=many
expect_error bench_unknown_key 2 "unknown.yaml|rollout.temprature|unknown key" -- bench "$TMP/unknown.yaml" --modes colocated-sync --work-dir "$TMP/bench"
[ ! -e "$TMP/sft" ] && [ ! -e "$TMP/bm.json" ] && [ ! -e "$TMP/bench" ] &&
  { pass=$((pass + 1)); echo "ok   rejected configs wrote no output"; } ||
  { fail=$((fail + 1)); echo "FAIL a rejected config left output behind: $(ls "$TMP")"; }

# submit checks the file locally before it connects. The "controller" here
# accepts TCP connections and never answers, so any RPC would hang until its
# 30 s deadline: a bad config must give exit 2 well within 10 s, while a good
# one is still waiting after 3 s (which shows the listener really is silent).
SILENT_PORT_FILE="$TMP/silent.port"
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
time.sleep(120)' "$SILENT_PORT_FILE" &
silent_pid=$!
trap 'kill "$silent_pid" 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 100); do [ -s "$SILENT_PORT_FILE" ] && break; sleep 0.1; done
SILENT="127.0.0.1:$(cat "$SILENT_PORT_FILE" 2>/dev/null)"
# expect_fast NAME SECONDS EXPECTED_CODE PATTERNS -- ARGS...: expect_error,
# and the command must end within SECONDS.
expect_fast() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  expect_error "$name" "$@"
  local took=$((SECONDS - t0))
  if [ "$took" -le "$limit" ]; then
    pass=$((pass + 1)); echo "ok   $name within ${limit} s (${took} s)"
  else
    fail=$((fail + 1)); echo "FAIL $name took ${took} s (want <= ${limit} s: no network wait)"
  fi
}
expect_fast submit_unknown_key 10 2 "unknown.yaml|rollout.temprature|unknown key" -- submit "$TMP/unknown.yaml" --controller "$SILENT"
expect_fast submit_wrong_type 10 2 "type.yaml|rollout.temperature|expected a number" -- submit "$TMP/type.yaml" --controller "$SILENT"
expect_fast submit_bad_override 10 2 "--set rollout.temprature=0.7|unknown key" -- submit "$HERE/data/tiny.yaml" --controller "$SILENT" --set rollout.temprature=0.7
rc=0; timeout 3 "$BIN" submit "$HERE/data/tiny.yaml" --controller "$SILENT" >/dev/null 2>&1 || rc=$?
if [ "$rc" -eq 124 ]; then
  pass=$((pass + 1)); echo "ok   a good config to the silent controller is still waiting after 3 s"
else
  fail=$((fail + 1)); echo "FAIL good config to the silent controller: exit $rc within 3 s (want still waiting)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

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

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

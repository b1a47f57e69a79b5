#!/usr/bin/env bash
# Multi-turn RL through the Python environment server (env.name: remote)
# against the in-process calculator: configs/agent-calc.yaml shortened
# (a short SFT on demonstrated episodes, then 2 GRPO steps), the same seed,
# the same episodes: every step's metrics agree. Then a server that never
# answers a Step: the job still finishes, with the failed episodes counted
# (env_failed_episodes) and no wait past the call deadline; and one that
# exits during a Step and stays away: the job fails past
# env.unavailable_seconds, naming the server (tests/env_unavailable_test.sh
# has the server that comes back).
#
#   tests/env_remote_job_test.sh FUSIONRL WORKDIR CONFIG
set -euo pipefail
FUSIONRL=$1
WORK=$2
CONFIG=$3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SERVER=$ROOT/examples/env_server/calculator_server.py

source "$ROOT/tests/grpc_python.sh" env_remote_job

rm -rf "$WORK"
mkdir -p "$WORK"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

# start_server NAME ARGS...: sets PORT once the server listens.
start_server() {
  local name=$1; shift
  "$PY" "$SERVER" --port 0 "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  pids+=("$!")
  PORT=""
  for _ in $(seq 200); do
    PORT=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' "$WORK/$name.out" | head -1)
    [ -n "$PORT" ] && return 0
    sleep 0.1
  done
  echo "FAIL: server $name did not start"; cat "$WORK/$name.err"; exit 1
}
start_server same
SAME_PORT=$PORT
start_server exits --exit-on-step 50
EXIT_PORT=$PORT
start_server hangs --hang-on-step 45
HANG_PORT=$PORT

SETS=(--set num_threads=1 --set run.total_steps=2 --set run.eval_every=0
      --set task.eval_size=16 --set rollout.prompts_per_step=4
      --set rollout.group_size=4 --set sft.steps=30 --set sft.batch_size=32
      --set sft.eval_every=0)
"$FUSIONRL" sft "$CONFIG" --output-dir "$WORK/sft" --set init_checkpoint= \
  "${SETS[@]}" >/dev/null 2>"$WORK/sft.log" || { cat "$WORK/sft.log"; exit 1; }
run() {  # run NAME extra --set args...
  local name=$1; shift
  "$FUSIONRL" run "$CONFIG" --output-dir "$WORK/$name" \
    --init-checkpoint "$WORK/sft/checkpoints/final" "${SETS[@]}" "$@" \
    >/dev/null 2>"$WORK/$name.log" || { echo "FAIL: run $name"; tail -20 "$WORK/$name.log"; exit 1; }
}
run local
run remote --set env.name=remote --set env.address=127.0.0.1:$SAME_PORT
start=$(date +%s)
exits_rc=0
"$FUSIONRL" run "$CONFIG" --output-dir "$WORK/exits" \
  --init-checkpoint "$WORK/sft/checkpoints/final" "${SETS[@]}" \
  --set env.name=remote --set env.address=127.0.0.1:$EXIT_PORT \
  --set env.unavailable_seconds=1 >/dev/null 2>"$WORK/exits.log" || exits_rc=$?
if [ "$exits_rc" = 0 ] || ! grep -q "127.0.0.1:$EXIT_PORT" "$WORK/exits.log" \
   || ! grep -q unreachable "$WORK/exits.log"; then
  echo "FAIL: exits: the job did not fail naming the unreachable server"
  tail -5 "$WORK/exits.log"; exit 1
fi
echo "ok   exits: the job failed: $(grep -o 'env: the environment is unreachable[^;]*' "$WORK/exits.log" | head -1)"
run hangs --set env.name=remote --set env.address=127.0.0.1:$HANG_PORT \
  --set env.call_deadline_seconds=2
seconds=$(( $(date +%s) - start ))

"$PY" - "$WORK" "$seconds" <<'PY'
import json, sys
work, seconds = sys.argv[1], int(sys.argv[2])
def records(name):
    return [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
local, remote = records("local"), records("remote")
keys = ["reward_mean", "rollout_tokens", "loss", "env_turns_mean",
        "env_tool_calls_mean", "env_tool_errors_mean", "env_masked_frac",
        "env_failed_episodes"]
ok = True
for a, b in zip(local, remote):
    for k in keys:
        if a[k] != b[k]:
            print(f"FAIL: step {a['step']} {k}: in-process {a[k]} vs remote {b[k]}")
            ok = False
if len(local) != 2 or len(remote) != 2:
    print("FAIL: expected 2 steps each"); ok = False
calls = sum(r["env_tool_calls_mean"] for r in local)
if calls <= 0:
    print("FAIL: no tool was called (the comparison would be vacuous)"); ok = False
for name in ("hangs",):
    failed = sum(r["env_failed_episodes"] for r in records(name))
    if failed < 1:
        print(f"FAIL: {name}: no episode failed"); ok = False
    print(f"ok   {name}: {failed:.0f} episodes failed, the job finished")
if seconds > 60:
    print(f"FAIL: the failing servers' runs took {seconds}s"); ok = False
if not ok:
    sys.exit(1)
print(f"PASS: remote == in-process over {len(local)} steps "
      f"(tool calls per episode, summed over the steps: {calls:.2f})")
PY

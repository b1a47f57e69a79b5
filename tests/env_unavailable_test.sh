#!/usr/bin/env bash
# Issue 52, defect 7: a job never trains on the empty steps of an
# environment server that is down. tests/env_negative_server.py is killed
# (os._exit) at its 40th Step, inside the job's second step:
#   back:  restarted on the same port 5 s later (longer than a step): the
#          job waits (env.unavailable_seconds 40), runs the lost episodes
#          again and finishes; no step has a failed episode, and the
#          restarted server gave rewards to episodes of every step after.
#   never: never restarted (env.unavailable_seconds 4): the job fails,
#          non-zero, naming the server's address and the reason, within
#          the budget plus a margin.
# Before the fix both jobs SUCCEEDED, the steps after the kill with every
# episode failed ("connection refused").
#
#   tests/env_unavailable_test.sh FUSIONRL WORKDIR CONFIG
set -euo pipefail
FUSIONRL=$1
WORK=$2
CONFIG=$3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SERVER=$ROOT/tests/env_negative_server.py

source "$ROOT/tests/grpc_python.sh" env_unavailable

rm -rf "$WORK"
mkdir -p "$WORK"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# start_server NAME PORT ARGS...: returns once it listens; SERVER_PID.
start_server() {
  local name=$1 port=$2; shift 2
  "$PY" "$SERVER" --port "$port" --log "$WORK/$name.log.jsonl" "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" &
  SERVER_PID=$!
  pids+=("$SERVER_PID")
  for _ in $(seq 200); do
    grep -q "^listening on $port\$" "$WORK/$name.out" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: server $name did not start"; cat "$WORK/$name.err"; exit 1
}

SETS=(--set num_threads=1 --set init_checkpoint= --set run.total_steps=4
      --set run.eval_every=0 --set task.eval_size=1
      --set rollout.prompts_per_step=4 --set rollout.group_size=4
      --set env.name=remote --set env.call_deadline_seconds=3)

# back: killed at its 40th Step, restarted on the same port 5 s later.
PORT_BACK=$(free_port)
start_server first "$PORT_BACK" --exit-on-step 40
FIRST_PID=$SERVER_PID
"$FUSIONRL" run "$CONFIG" --output-dir "$WORK/back" "${SETS[@]}" \
  --set env.address=127.0.0.1:$PORT_BACK --set env.unavailable_seconds=40 \
  >/dev/null 2>"$WORK/back.job.log" &
JOB=$!
pids+=("$JOB")
for _ in $(seq 600); do
  kill -0 "$FIRST_PID" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$FIRST_PID" 2>/dev/null; then
  echo "FAIL: back: the server was never killed (fewer than 40 Steps)"; exit 1
fi
killed_at=$(date +%s.%N)
sleep 5
start_server second "$PORT_BACK"
back_rc=0
wait "$JOB" || back_rc=$?

# never: killed at its 40th Step, never back.
PORT_NEVER=$(free_port)
start_server never "$PORT_NEVER" --exit-on-step 40
start=$(date +%s)
never_rc=0
"$FUSIONRL" run "$CONFIG" --output-dir "$WORK/never" "${SETS[@]}" \
  --set env.address=127.0.0.1:$PORT_NEVER --set env.unavailable_seconds=4 \
  >/dev/null 2>"$WORK/never.job.log" || never_rc=$?
never_seconds=$(( $(date +%s) - start ))

"$PY" - "$WORK" "$back_rc" "$never_rc" "$never_seconds" "$PORT_NEVER" <<'PY'
import json, os, sys
work, back_rc, never_rc, never_seconds, port = sys.argv[1:6]
ok = True
def fail(msg):
    global ok
    print("FAIL: " + msg); ok = False

# back
steps = []
if os.path.exists(f"{work}/back/metrics.jsonl"):
    steps = [json.loads(l) for l in open(f"{work}/back/metrics.jsonl")]
failed = [int(r["env_failed_episodes"]) for r in steps]
second = [json.loads(l) for l in open(f"{work}/second.log.jsonl")] \
    if os.path.exists(f"{work}/second.log.jsonl") else []
print(f"back: exit {back_rc}, {len(steps)} steps, failed episodes per step "
      f"{failed}; the restarted server gave {len(second)} rewards")
if back_rc != "0":
    fail("back: the job failed although its server came back")
if len(steps) != 4:
    fail("back: expected 4 steps")
if any(failed):
    fail("back: steps trained on episodes the down server failed")
# Step 2 (killed at its 40th Step, ~2 Steps an episode) to step 4: at least
# its rest and two whole steps of 16 episodes ran on the restarted server.
if len(second) < 33:
    fail("back: the restarted server scored fewer than 33 episodes")
log = open(f"{work}/back.job.log").read()
if "retrying" not in log:
    fail("back: no retry was logged")

# never
log = open(f"{work}/never.job.log").read()
print(f"never: exit {never_rc} after {never_seconds} s; "
      + (log.strip().splitlines() or ["(no log)"])[-1][:400])
if never_rc == "0":
    fail("never: the job succeeded with its environment gone")
for needed in (f"127.0.0.1:{port}", "unreachable", "env.unavailable_seconds"):
    if needed not in log:
        fail(f"never: the failure does not say '{needed}'")
if int(never_seconds) > 60:
    fail(f"never: took {never_seconds} s (budget 4 s)")
sys.exit(0 if ok else 1)
PY
echo "PASS: a down environment is waited for, or fails the job loudly"

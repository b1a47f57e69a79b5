#!/usr/bin/env bash
# Issue 52, defect 6: the environment has the last word on every episode,
# cut or not. tests/env_negative_server.py (rewards of its own: 1.0 right,
# 0.5 right after its "no", -0.25 wrong, -0.75 for an episode the client
# cuts) logs every reward it gives; the job's per-step reward_mean, over
# the training episodes, must be the mean of exactly those rewards, and
# every training episode must have got one. Two jobs from a fresh policy
# (whose answers are wrong, so the limits cut most episodes): one cut by
# env.max_turns 1, one by env.max_episode_tokens (inside a turn or before
# an answer that does not fit). Before the fix a cut episode never reached
# the server and took reward 0.
#
#   tests/env_negative_reward_test.sh FUSIONRL WORKDIR CONFIG
set -euo pipefail
FUSIONRL=$1
WORK=$2
CONFIG=$3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SERVER=$ROOT/tests/env_negative_server.py

source "$ROOT/tests/grpc_python.sh" env_negative_reward

rm -rf "$WORK"
mkdir -p "$WORK"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

# start_server NAME ARGS...: sets PORT once the server listens.
start_server() {
  local name=$1; shift
  "$PY" "$SERVER" --port 0 --log "$WORK/$name.log.jsonl" "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" &
  pids+=("$!")
  PORT=""
  for _ in $(seq 200); do
    PORT=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' "$WORK/$name.out" | head -1)
    [ -n "$PORT" ] && return 0
    sleep 0.1
  done
  echo "FAIL: server $name did not start"; cat "$WORK/$name.err"; exit 1
}

# 2 steps of 16 episodes; task.eval_size 1: the two evaluations (before
# the first step, after the last) are two episodes of one seed.
SETS=(--set num_threads=1 --set init_checkpoint= --set run.total_steps=2
      --set run.eval_every=0 --set task.eval_size=1
      --set rollout.prompts_per_step=4 --set rollout.group_size=4
      --set env.name=remote --set env.call_deadline_seconds=5)
run() {  # run NAME extra --set args...
  local name=$1; shift
  start_server "$name"
  "$FUSIONRL" run "$CONFIG" --output-dir "$WORK/$name" "${SETS[@]}" \
    --set env.address=127.0.0.1:$PORT "$@" >/dev/null 2>"$WORK/$name.job.log" \
    || { echo "FAIL: run $name"; tail -20 "$WORK/$name.job.log"; exit 1; }
}
run turns --set env.max_turns=1
run tokens --set env.max_turns=3 --set env.max_episode_tokens=20

"$PY" - "$WORK" <<'PY'
import collections, json, os, sys
work = sys.argv[1]
ok = True
for name, reason in (("turns", 1), ("tokens", 2)):
    steps = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
    log = f"{work}/{name}.log.jsonl"  # absent: the server gave nothing
    given = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
    by_seed = collections.defaultdict(list)
    for g in given:
        by_seed[g["seed"]].append(g)
    evals = [s for s, v in by_seed.items() if len(v) > 1]
    train = [v[0] for s, v in by_seed.items() if len(v) == 1]
    n = 16 * len(steps)
    job_sum = sum(r["reward_mean"] * 16 for r in steps)
    env_sum = sum(g["reward"] for g in train)
    cuts = [g for g in train if g["how"] == "cut"]
    print(f"{name}: {len(steps)} steps; the server gave {len(train)} of "
          f"{n} training episodes their reward ({len(cuts)} cut, reasons "
          f"{sorted(collections.Counter(g['reason'] for g in cuts).items())},"
          f" inside a turn {sum(g['cut_turn'] for g in cuts)}); "
          f"rewards summed: job {job_sum:.4f}, server {env_sum:.4f}")
    if len(steps) != 2 or len(evals) != 1:
        print(f"FAIL: {name}: expected 2 steps and one evaluated seed, got "
              f"{len(steps)} and {len(evals)}"); ok = False
    if len(train) != n:
        print(f"FAIL: {name}: {n - len(train)} training episodes ended "
              "without the environment's last word"); ok = False
    if abs(job_sum - env_sum) > 1e-6:
        print(f"FAIL: {name}: the job trained on rewards summing to "
              f"{job_sum:.4f}, the environment gave {env_sum:.4f}"); ok = False
    if not any(g["reason"] == reason for g in cuts):
        print(f"FAIL: {name}: no episode was cut with reason {reason} "
              "(the check would be vacuous)"); ok = False
    if name == "turns" and any(g["cut_turn"] for g in cuts):
        print("FAIL: turns: a max_turns cut carried a cut turn"); ok = False
sys.exit(0 if ok else 1)
PY
echo "PASS: every cut episode took its environment's reward"

#!/usr/bin/env bash
# Chaos soak: a controller and three worker processes (super nodes a, b, c)
# run one job while this script, for CHAOS_SECONDS (default 60), every 1-3 s
# picks a worker at random and kills it (SIGKILL, started again 1 s later),
# freezes it (SIGSTOP for 1-7 s: past the 4 s heartbeat timeout it is
# declared lost, and exits when it wakes), or leaves it alone; a worker that
# exits is started again. A job whose every node is lost fails; it is
# resubmitted with --resume, as a user would. Then the workers are left in
# peace until the job succeeds.
#
# Asserted at the end, the ledger invariants: the job succeeded; metrics.jsonl
# holds steps 1..N exactly once; the cards trained every prompt group
# exactly once (count, sum and sum of squares of the trained ids, from
# their own records); the controller's ledger of the last submission says
# groups trained == submitted; no process died of anything but this
# script's SIGKILL (a worker exits 0, 1 or 2: lost); the controller still
# answers. The schedule is drawn from CHAOS_SEED (printed; set it to replay
# the same schedule, timings aside).
#
# Then a SIGKILL mid-checkpoint: a worker that pauses inside every
# checkpoint write (files written, not yet moved into place) is killed
# there; the job fails (no node left), and its resubmission with --resume
# continues from the checkpoint before, ignores the half-written one, and
# ends with every step and prompt group once.
# Usage: $0 FUSIONRL_BINARY WORK_DIR
set -euo pipefail
BIN=$1
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT"
mkdir -p "$OUT"
CFG="$HERE/data/tiny.yaml"
CHAOS_SECONDS=${CHAOS_SECONDS:-60}
SEED=${CHAOS_SEED:-$(( $(date +%s) % 32768 ))}
# Steps slowed by 200 ms on every worker: the job outlasts most of the faults.
STEPS=120
RANDOM=$SEED
echo "chaos seed $SEED, $CHAOS_SECONDS s of faults (replay: CHAOS_SEED=$SEED)"

# shellcheck source=cluster_lib.sh
source "$HERE/cluster_lib.sh"

start_controller controller --heartbeat-interval 0.5 --heartbeat-timeout 4
ADDR=$CTL_ADDR

SUPER_NODES=(a b c)
declare -A WPID=() STARTS=()
CRASHES=()
KILLS=0 FREEZES=0 RESTARTS=0 RESUBMITS=0
start_worker() {
  local sn=$1 n=${STARTS[$1]:-0}
  STARTS[$sn]=$((n + 1))
  "$BIN" worker --controller "$ADDR" --super-node "$sn" --threads 1 \
    --debug-step-delay-ms 200 >"$OUT/worker-$sn-$n.out" 2>"$OUT/worker-$sn-$n.log" &
  WPID[$sn]=$!
  PIDS+=("$!")
}
# reap_workers: a worker that exited is checked (0, 1 or 2: lost) and
# started again.
reap_workers() {
  local sn pid rc
  for sn in "${SUPER_NODES[@]}"; do
    pid=${WPID[$sn]}
    kill -0 "$pid" 2>/dev/null && continue
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    forget "$pid"
    case "$rc" in
      0|1|2) ;;
      *) CRASHES+=("worker $sn (pid $pid) exit $rc, not killed by the test") ;;
    esac
    echo "     $(date +%T) worker $sn exited ($rc); starting it again"
    RESTARTS=$((RESTARTS + 1))
    start_worker "$sn"
  done
}
JOB_ARGS=(--set placement.super_nodes=3 --set rollout.prompts_per_step=12
          --set run.total_steps=$STEPS --set run.checkpoint_every=4
          --set run.eval_every=0 --output-dir "$OUT/job")
submit() {  # submit [--resume]: sets JOB
  JOB=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR" "${JOB_ARGS[@]}" "$@" \
        2>>"$OUT/submit.log") || fail "submit $* failed: $(tail -n 3 "$OUT/submit.log")"
  echo "     $(date +%T) submitted $JOB $*"
}
# drive_job: resubmits the job with --resume when it failed (every node
# lost); returns 0 once it succeeded.
drive_job() {
  local phase
  phase=$(phase_of "$ADDR" "$JOB" "$OUT/job-status.json")
  case "$phase" in
    JOB_PHASE_SUCCEEDED) return 0 ;;
    JOB_PHASE_FAILED)
      "$BIN" status --controller "$ADDR" --job "$JOB" >>"$OUT/failed-jobs.txt" 2>&1 || true
      RESUBMITS=$((RESUBMITS + 1))
      [ "$RESUBMITS" -le 20 ] || fail "more than 20 resubmissions"
      submit --resume ;;
    JOB_PHASE_CANCELLED) fail "$JOB was cancelled, which nothing here asked for" ;;
  esac
  return 1
}

for sn in "${SUPER_NODES[@]}"; do start_worker "$sn"; done
submit
wait_steps "$OUT/job/metrics.jsonl" 2 120 "$JOB"
echo "ok   $JOB running on 3 workers; faults for $CHAOS_SECONDS s"

done_early=0
chaos_end=$((SECONDS + CHAOS_SECONDS))
while [ "$SECONDS" -lt "$chaos_end" ]; do
  sleep "$((1 + RANDOM % 3))"
  reap_workers
  if drive_job; then done_early=1; break; fi
  sn=${SUPER_NODES[$((RANDOM % 3))]}
  pid=${WPID[$sn]}
  # A worker may exit at any moment (declared lost): a signal that finds
  # no process is skipped, and the next round starts the worker again.
  case $((RANDOM % 3)) in
    0)
      kill -KILL "$pid" 2>/dev/null || continue
      echo "     $(date +%T) SIGKILL worker $sn"
      { wait "$pid"; } 2>/dev/null || true
      forget "$pid"
      KILLS=$((KILLS + 1))
      sleep 1
      start_worker "$sn" ;;
    1)
      pause=$((1 + RANDOM % 7))
      kill -STOP "$pid" 2>/dev/null || continue
      echo "     $(date +%T) SIGSTOP worker $sn for $pause s"
      FREEZES=$((FREEZES + 1))
      # Woken in the background; a worker killed meanwhile is not there.
      { sleep "$pause"; kill -CONT "$pid" 2>/dev/null || true; } &
      ;;
    *) ;;
  esac
done
echo "ok   faults over: $KILLS SIGKILLs, $FREEZES freezes, $RESTARTS restarts after exits, $RESUBMITS resubmissions"

# Peace: wake every worker, restart the ones that exited, let the job end.
for sn in "${SUPER_NODES[@]}"; do kill -CONT "${WPID[$sn]}" 2>/dev/null || true; done
deadline=$((SECONDS + 400))
until [ "$done_early" -eq 1 ] || drive_job; do
  [ "$SECONDS" -lt "$deadline" ] || fail "$JOB not done within 400 s of the last fault"
  sleep 1
  reap_workers
done
"$BIN" status --controller "$ADDR" --job "$JOB" --json >"$OUT/status.json" ||
  fail "the controller no longer answers status"
kill -0 "$CTL_PID" 2>/dev/null || fail "the controller died"
echo "ok   $JOB succeeded after $RESUBMITS resubmission(s)"
printf '%s\n' ${CRASHES[@]+"${CRASHES[@]}"} >"$OUT/crashes.txt"
grep -h "lost\|aborted\|re-queued" "$OUT/controller.log" | tail -n 5 || true

# 2. SIGKILL during a checkpoint write. The soak's workers leave (SIGTERM:
#    a clean exit, 0); worker d pauses 3 s inside every checkpoint write.
for sn in "${SUPER_NODES[@]}"; do
  kill -TERM "${WPID[$sn]}" 2>/dev/null || true
  wait_exit "${WPID[$sn]}" 30
  case "$EXIT_RC" in 0|1|2) ;; *) fail "worker $sn exit $EXIT_RC after SIGTERM" ;; esac
done
"$BIN" worker --controller "$ADDR" --super-node d --threads 1 \
  --debug-checkpoint-delay-ms 3000 >/dev/null 2>"$OUT/worker-d.log" &
wd_pid=$!
PIDS+=("$wd_pid")
CKPT_ARGS=(--set rollout.prompts_per_step=12 --set run.total_steps=12
           --set run.checkpoint_every=4 --set run.eval_every=0
           --output-dir "$OUT/ckpt-kill")
ckpt_job=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR" "${CKPT_ARGS[@]}" 2>>"$OUT/submit.log")
# meta.json is the last file of a checkpoint: in step_8.tmp it means the
# writer is in its pause.
deadline=$((SECONDS + 120))
until [ -f "$OUT/ckpt-kill/checkpoints/step_8.tmp/meta.json" ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "$ckpt_job never reached the write of checkpoint step_8"
  sleep 0.05
done
kill_hard "$wd_pid"
echo "ok   worker d killed (SIGKILL) while writing checkpoint step_8 of $ckpt_job"
deadline=$((SECONDS + 60))
until [ "$(phase_of "$ADDR" "$ckpt_job" "$OUT/ckpt-status.json")" = JOB_PHASE_FAILED ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "$ckpt_job did not fail after losing its only node"
  sleep 0.5
done
"$BIN" worker --controller "$ADDR" --super-node e --threads 1 >/dev/null 2>"$OUT/worker-e.log" &
PIDS+=("$!")
resumed_job=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR" "${CKPT_ARGS[@]}" --resume \
              2>>"$OUT/submit.log")
wait_job "$ADDR" "$resumed_job" "$OUT/ckpt-status.json" 300

python3 - "$OUT" "$STEPS" <<'PY'
import json, os, sys
out, steps = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, out)
import checks
from checks import check

st = json.load(open(os.path.join(out, "status.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"the job succeeded ({st['phase']})")
sub, trained = int(st["groups_submitted"]), int(st["groups_trained"])
check(sub == trained, f"ledger of the last submission: groups trained == submitted ({trained}/{sub})")
rows = checks.rows(os.path.join(out, "job", "metrics.jsonl"))
got = [r["step"] for r in rows]
check(got == list(range(1, steps + 1)), f"metrics.jsonl: steps 1..{steps} exactly once ({len(rows)} lines)")
ok, text = checks.groups_once(rows, 12)
check(ok, f"the cards trained every prompt group exactly once ({text})")
check(all(r["trained_groups"] == 12 for r in rows), "every committed step trained 12 groups")
attempts = sum(1 for r in rows if r.get("attempt", 1) > 1)
nodes = sorted({int(r.get("nodes", 0)) for r in rows})
print(f"     steps replanned: {attempts}; node counts seen: {nodes}")
crashes = [l for l in open(os.path.join(out, "crashes.txt")).read().splitlines() if l]
check(not crashes, f"no process died of anything but SIGKILL ({crashes})")

# 2. The checkpoint write killed mid-way.
st = json.load(open(os.path.join(out, "ckpt-status.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"the resubmitted job succeeded ({st['phase']})")
resumed = [e["text"] for e in st.get("events", []) if "resuming from" in e["text"]]
check(len(resumed) == 1 and resumed[0].rstrip(")").endswith("checkpoints/step_4"),
      f"it resumed from checkpoint step_4, the last one written whole ({resumed})")
ckdir = os.path.join(out, "ckpt-kill", "checkpoints")
left = sorted(d for d in os.listdir(ckdir) if d.endswith(".tmp") or d.endswith(".old"))
check(not left, f"no half-written checkpoint left ({left})")
rows = checks.rows(os.path.join(out, "ckpt-kill", "metrics.jsonl"))
check([r["step"] for r in rows] == list(range(1, 13)), f"metrics.jsonl: steps 1..12 exactly once ({len(rows)} lines)")
ok, text = checks.groups_once(rows, 12)
check(ok, f"every prompt group trained exactly once ({text})")
checks.finish()
PY

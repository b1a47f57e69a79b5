#!/usr/bin/env bash
# Cluster mode through the CLI: a controller and two worker processes on this
# machine. A job submitted to them matches the same job run in one process
# (`fusionrl run` with two in-process workers); a worker killed with SIGKILL
# mid-job is declared lost, its prompt groups are re-queued and the job still
# finishes every step exactly once on the worker left; SIGTERM then shuts the
# controller and that worker down cleanly.
# Usage: $0 FUSIONRL_BINARY WORK_DIR
set -euo pipefail
BIN=$1
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT"
mkdir -p "$OUT"
CFG="$HERE/data/tiny.yaml"
SFT_CKPT="$OUT/sft/checkpoints/final"

# Every process started here is killed on exit, whatever the outcome; on a
# failure the tails of their logs say why.
PIDS=()
on_exit() {
  local rc=$?
  local p
  for p in ${PIDS[@]+"${PIDS[@]}"}; do kill -KILL "$p" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    local f
    for f in "$OUT"/*.log; do
      [ -s "$f" ] || continue
      echo "---- last lines of $f"
      tail -n 20 "$f"
    done
  fi
}
trap on_exit EXIT
forget() {  # drop a reaped pid so the exit trap never signals a reused one
  local keep=() p
  for p in ${PIDS[@]+"${PIDS[@]}"}; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=(${keep[@]+"${keep[@]}"})
}
fail() { echo "FAIL $*"; exit 1; }
# wait_exit PID SECONDS: sets EXIT_RC to the exit status of PID, or to 124
# (after a SIGKILL) if it is still running after SECONDS. Not for $(...): a
# subshell cannot wait for this shell's children.
EXIT_RC=
wait_exit() {
  local pid=$1 limit=$2 late=0
  timeout "$limit" tail --pid="$pid" -f /dev/null || { kill -KILL "$pid" 2>/dev/null || true; late=1; }
  EXIT_RC=0
  wait "$pid" || EXIT_RC=$?
  forget "$pid"
  [ "$late" -eq 0 ] || EXIT_RC=124
}

# 1. Warm start: from an untrained policy the eval accuracy is 0, so RL
#    quality could not be compared.
timeout 300 "$BIN" sft "$CFG" --output-dir "$OUT/sft" >/dev/null 2>"$OUT/sft.log"
[ -d "$SFT_CKPT" ] || fail "sft wrote no checkpoint at $SFT_CKPT"
echo "ok   sft warm start"

# 2. Reference: the same job in one process with two in-process workers.
ref_summary=$(timeout 300 "$BIN" run "$CFG" --output-dir "$OUT/ref" --init-checkpoint "$SFT_CKPT" \
              --set placement.super_nodes=2 --set run.total_steps=30 --set run.eval_every=0 \
              2>"$OUT/ref.log")
echo "ok   reference run ($ref_summary)"

# 3. The cluster: a controller and workers on super nodes a and b.
"$BIN" controller --listen 127.0.0.1:0 --heartbeat-interval 0.5 --heartbeat-timeout 2 \
  >"$OUT/controller.out" 2>"$OUT/controller.log" &
ctl_pid=$!
PIDS+=("$ctl_pid")
deadline=$((SECONDS + 30))
until grep -q '^listening on ' "$OUT/controller.out"; do
  kill -0 "$ctl_pid" 2>/dev/null || fail "controller exited before listening"
  [ "$SECONDS" -lt "$deadline" ] || fail "controller printed no 'listening on' line in 30 s"
  sleep 0.2
done
ADDR=$(sed -n 's/^listening on //p' "$OUT/controller.out")
[ "$(wc -l < "$OUT/controller.out")" -eq 1 ] || fail "controller stdout is not one line: $(cat "$OUT/controller.out")"
echo "ok   controller listening on $ADDR"

"$BIN" worker --controller "$ADDR" --super-node a >"$OUT/worker-a.out" 2>"$OUT/worker-a.log" &
wa_pid=$!
PIDS+=("$wa_pid")
"$BIN" worker --controller "$ADDR" --super-node b >"$OUT/worker-b.out" 2>"$OUT/worker-b.log" &
wb_pid=$!
PIDS+=("$wb_pid")
deadline=$((SECONDS + 30))
until grep -q 'registered as' "$OUT/worker-a.log" && grep -q 'registered as' "$OUT/worker-b.log"; do
  kill -0 "$wa_pid" 2>/dev/null || fail "worker a exited before registering"
  kill -0 "$wb_pid" 2>/dev/null || fail "worker b exited before registering"
  [ "$SECONDS" -lt "$deadline" ] || fail "workers did not register in 30 s"
  sleep 0.2
done
echo "ok   both workers registered"

submit_rc=0
job1=$(timeout 300 "$BIN" submit "$CFG" --controller "$ADDR" \
       --set placement.super_nodes=2 --set run.total_steps=30 --set run.eval_every=0 \
       --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/cluster" --wait \
       2>"$OUT/submit-1.log") || submit_rc=$?
"$BIN" status --controller "$ADDR" --job "$job1" --json >"$OUT/status-1.json"

python3 - "$submit_rc" "$job1" "$OUT" "$ref_summary" <<'PY'
import json, os, sys
rc, job, out, ref_path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
failures = []
def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond: failures.append(what)

check(rc == 0, f"submit --wait exits 0 (got {rc})")
check(job.startswith("job-"), f"submit prints the job id ({job!r})")
st = json.load(open(os.path.join(out, "status-1.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"cluster job succeeded ({st['phase']})")
sub, trained = int(st["groups_submitted"]), int(st["groups_trained"])
check(sub == trained == 30 * 16, f"groups trained == submitted == 480 ({trained}/{sub})")
supers = sorted(n["super_node"] for n in st["nodes"])
check(supers == ["a", "b"], f"both super nodes in the job ({supers})")
check(all(n["state"] == "alive" for n in st["nodes"]), "both nodes alive")

ref = json.load(open(ref_path))
summary_path = os.path.join(out, "cluster", "summary.json")
check(os.path.exists(summary_path), "cluster summary.json written")
if os.path.exists(summary_path):
    clu = json.load(open(summary_path))
    check(clu["steps"] == 30, f"cluster summary: 30 steps ({clu['steps']})")
    a, b = ref["final_eval_accuracy"], clu["final_eval_accuracy"]
    print(f"     final eval accuracy: reference {a:.3f}, cluster {b:.3f}")
    check(abs(a - b) <= 0.05, "cluster accuracy within 0.05 of the reference")

rows = [json.loads(l) for l in open(os.path.join(out, "cluster", "metrics.jsonl"))]
check(len(rows) == 30 and [r["step"] for r in rows] == list(range(1, 31)),
      f"metrics.jsonl has steps 1..30 ({len(rows)} lines)")
check(all(r.get("nodes") == 2 for r in rows), "every step ran on 2 nodes")
sys.exit(1 if failures else 0)
PY

# 4. SIGKILL a worker mid-job: the controller declares it lost, re-queues its
#    prompt groups and finishes the job on the worker left.
job2=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR" \
       --set placement.super_nodes=2 --set run.total_steps=40 --set run.eval_every=0 \
       --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/kill" 2>"$OUT/submit-2.log")
deadline=$((SECONDS + 120))
until [ -f "$OUT/kill/metrics.jsonl" ] && [ "$(wc -l < "$OUT/kill/metrics.jsonl")" -ge 5 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "$job2 wrote fewer than 5 steps in 120 s"
  sleep 0.1
done
kill -KILL "$wb_pid"
steps_at_kill=$(wc -l < "$OUT/kill/metrics.jsonl")
{ wait "$wb_pid"; } 2>/dev/null || true  # braces: also silences the "Killed" notice
forget "$wb_pid"
echo "ok   killed worker b (SIGKILL) after $steps_at_kill steps of $job2"

deadline=$((SECONDS + 300))
while :; do
  "$BIN" status --controller "$ADDR" --job "$job2" --json >"$OUT/status-2.json" 2>>"$OUT/status.log" || true
  phase=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("phase", ""))' \
          "$OUT/status-2.json" 2>/dev/null || true)
  case "$phase" in JOB_PHASE_SUCCEEDED|JOB_PHASE_FAILED|JOB_PHASE_CANCELLED) break ;; esac
  [ "$SECONDS" -lt "$deadline" ] || fail "$job2 not finished 300 s after the kill (phase '$phase')"
  sleep 0.5
done

python3 - "$OUT" "$steps_at_kill" <<'PY'
import json, os, sys
out, at_kill = sys.argv[1], int(sys.argv[2])
failures = []
def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond: failures.append(what)

st = json.load(open(os.path.join(out, "status-2.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"job survives the kill ({st['phase']} {st.get('message', '')!r})")
check(int(st["step"]) == 40, f"step 40 ({st['step']})")
sub, trained, requeued = (int(st[k]) for k in ("groups_submitted", "groups_trained", "groups_requeued"))
check(sub == trained == 40 * 16, f"groups trained == submitted == 640 ({trained}/{sub})")
check(requeued > 0, f"prompt groups re-queued ({requeued})")
by_super = {n["super_node"]: n for n in st["nodes"]}
check(by_super.get("b", {}).get("state") == "lost", "the node on super node b is lost")
check(by_super.get("a", {}).get("state") == "alive", "the node on super node a is alive")
texts = [e["text"] for e in st.get("events", [])]
check(any("lost" in t for t in texts), "an event reports the lost node")
for t in texts:
    print(f"     event: {t}")

rows = [json.loads(l) for l in open(os.path.join(out, "kill", "metrics.jsonl"))]
steps = [r["step"] for r in rows]
check(len(rows) == 40 and sorted(steps) == list(range(1, 41)),
      f"metrics.jsonl has steps 1..40 exactly once ({len(rows)} lines)")
nodes = [r.get("nodes") for r in rows]
check(all(n == 2 for n in nodes[:5]), "steps before the kill ran on 2 nodes")
# The step in flight at the kill may have just finished on both; every later one runs on a.
later = [r.get("nodes") for r in rows if r["step"] > at_kill + 1]
check(later and all(n == 1 for n in later), f"steps after {at_kill + 1} ran on 1 node")
check(nodes == sorted(nodes, reverse=True), "node count never grows back")
summary_path = os.path.join(out, "kill", "summary.json")
check(os.path.exists(summary_path), "summary.json written")
if os.path.exists(summary_path):
    check(json.load(open(summary_path))["steps"] == 40, "summary.json: 40 steps")
sys.exit(1 if failures else 0)
PY

# 5. SIGTERM the controller while a job runs: the job stops after its
#    current step with a checkpoint (CANCELLED, resumable), the controller
#    tells the workers to exit; both exit 0.
drain_id=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR" \
  --set run.total_steps=100000 --set run.eval_every=0 \
  --set init_checkpoint="$SFT_CKPT" \
  --output-dir "$OUT/drain" 2>>"$OUT/submit.log")
deadline=$((SECONDS + 120))
until [ -f "$OUT/drain/metrics.jsonl" ] && [ "$(wc -l < "$OUT/drain/metrics.jsonl")" -ge 3 ]; do
  [ $SECONDS -lt $deadline ] || fail "no steps of the drain job ($drain_id) within 120 s"
  sleep 0.2
done
# While it runs, status shows each card's memory by category.
"$BIN" status --controller "$ADDR" --job "$drain_id" --json >"$OUT/status-running.json"
"$BIN" status --controller "$ADDR" --job "$drain_id" >"$OUT/status-running.txt"
python3 - "$OUT" <<'PY' || fail "memory in status"
import json, os, sys
out = sys.argv[1]
st = json.load(open(os.path.join(out, "status-running.json")))
mem = [c["state"].get("memory_bytes", {}) for c in st["cards"]]
ok = len(mem) == 1 and all(int(m.get(k, 0)) > 0 for m in mem
                           for k in ("weights", "optimizer", "gradients", "peak_activations"))
print(("ok   " if ok else "FAIL ") + f"status shows the card's memory by category ({mem[0] if mem else {}})")
text = open(os.path.join(out, "status-running.txt")).read()
shown = text.count("memory: weights")
print(("ok   " if shown == 1 else "FAIL ") + f"the status table has the card's memory line ({shown})")
sys.exit(0 if ok and shown == 1 else 1)
PY
start=$SECONDS
kill -TERM "$ctl_pid"
wait_exit "$ctl_pid" 30
ctl_rc=$EXIT_RC
ctl_secs=$((SECONDS - start))
wait_exit "$wa_pid" 15
wa_rc=$EXIT_RC
[ "$ctl_rc" -eq 0 ] || fail "controller exit $ctl_rc after SIGTERM (want 0 within 30 s)"
echo "ok   controller exits 0 on SIGTERM with a job running (${ctl_secs}s)"
[ "$wa_rc" -eq 0 ] || fail "worker a exit $wa_rc after the controller shut down (want 0 within 15 s)"
echo "ok   worker a exits 0 when the controller shuts down"
python3 - "$OUT/drain" <<'PY' || fail "drain checks"
import json, os, sys
out = sys.argv[1]
s = json.load(open(os.path.join(out, "summary.json")))
rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
bad = []
def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond: bad.append(what)
check(s["interrupted"] is True, "drained job is marked interrupted")
check(s["steps"] == len(rows) and s["steps"] >= 3,
      f"summary steps == metrics lines ({s['steps']} / {len(rows)})")
ck = os.path.join(out, "checkpoints", f"step_{s['steps']}")
check(s["checkpoint_dir"] == ck and os.path.exists(os.path.join(ck, "model.pt")),
      f"checkpoint of the last step written ({os.path.basename(ck)})")
sys.exit(1 if bad else 0)
PY

# 6. StaleSync across super nodes (max_clock_skew k = 1) on a fresh cluster
#    whose worker b is slowed down (fault injection): worker a runs ahead,
#    but the two clocks never drift more than k + 1 = 2 apart, and after the
#    final sync both super nodes hold the same weights (CRC-32C per super
#    node in summary.json).
"$BIN" controller --listen 127.0.0.1:0 >"$OUT/controller-2.out" 2>"$OUT/controller-2.log" &
ctl2_pid=$!
PIDS+=("$ctl2_pid")
deadline=$((SECONDS + 30))
until grep -q '^listening on ' "$OUT/controller-2.out"; do
  kill -0 "$ctl2_pid" 2>/dev/null || fail "second controller exited before listening"
  [ "$SECONDS" -lt "$deadline" ] || fail "second controller printed no 'listening on' line in 30 s"
  sleep 0.2
done
ADDR2=$(sed -n 's/^listening on //p' "$OUT/controller-2.out")
"$BIN" worker --controller "$ADDR2" --super-node a --threads 1 >/dev/null 2>"$OUT/worker-a2.log" &
PIDS+=("$!")
"$BIN" worker --controller "$ADDR2" --super-node b --threads 1 --debug-step-delay-ms 150 \
  >/dev/null 2>"$OUT/worker-b2.log" &
PIDS+=("$!")
skew_rc=0
job3=$(timeout 300 "$BIN" submit "$CFG" --controller "$ADDR2" \
       --set placement.super_nodes=2 --set stalesync.max_clock_skew=1 \
       --set run.total_steps=20 --set run.checkpoint_every=10 --set run.eval_every=0 \
       --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/skew" --wait \
       2>"$OUT/submit-3.log") || skew_rc=$?
"$BIN" status --controller "$ADDR2" --job "$job3" --json >"$OUT/status-3.json"
python3 - "$skew_rc" "$OUT" <<'PY' || fail "StaleSync clock-skew checks"
import json, os, sys
rc, out = int(sys.argv[1]), sys.argv[2]
bad = []
def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond: bad.append(what)
check(rc == 0, f"StaleSync k=1 job: submit --wait exits 0 (got {rc})")
st = json.load(open(os.path.join(out, "status-3.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"StaleSync k=1 job succeeded ({st['phase']} {st.get('message', '')!r})")
s = json.load(open(os.path.join(out, "skew", "summary.json")))
seen = s.get("max_clock_skew_seen", -1)
check(1 <= seen <= 2, f"clocks drifted apart but never more than k+1 = 2 (max seen {seen})")
check(int(st.get("max_clock_skew_seen", -1)) == seen, "status reports the same max skew")
crc = s.get("final_weights_crc32c", {})
check(sorted(crc) == ["a", "b"] and len(set(crc.values())) == 1,
      f"after the final sync both super nodes hold identical weights ({crc})")
rows = [json.loads(l) for l in open(os.path.join(out, "skew", "metrics.jsonl"))]
check([r["step"] for r in rows] == list(range(1, 21)), f"metrics.jsonl has steps 1..20 ({len(rows)} lines)")
check(all(r["clock_skew"] <= 2 for r in rows), "clock_skew <= 2 at every commit")
check(max(r["max_update_lag"] for r in rows) <= 1, "no update applied more than k = 1 step late")
check(sum(r["updates_received"] for r in rows) == 20, "the lead applied each of b's 20 updates once")
syncs = [r["step"] for r in rows if r["weight_sync_bytes"] > 0]
check(syncs == [10, 20], f"weights synced at the checkpoint and the end ({syncs})")
print(f"     final eval accuracy {s['final_eval_accuracy']:.3f} (start {s['initial_eval_accuracy']:.3f})")
sys.exit(1 if bad else 0)
PY

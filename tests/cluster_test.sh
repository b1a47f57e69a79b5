#!/usr/bin/env bash
# Cluster mode through the CLI: a controller and two worker processes on this
# machine. A job submitted to them reproduces the same job run in one process
# (`fusionrl run` with two in-process workers) bit for bit, with its
# gradients summed by the controller or over the c10d data plane; a worker killed
# with SIGKILL mid-job is declared lost, its prompt groups are re-queued and
# the job still trains every prompt group exactly once (controller ledger and
# the cards' own records) on the worker left; SIGTERM then shuts the
# controller and that worker down cleanly; StaleSync lets a slowed super node
# lag by at most k + 1 clock steps, and on the c10d data plane still ends
# with the in-process run's weights bit for bit; a job stopped part way and
# resubmitted with `submit --resume` ends exactly as the uninterrupted job
# does, synchronous and RL Fusion with StaleSync; four worker processes on the c10d data plane reproduce the
# in-process four-super-node run bit for bit, and a StaleSync job on them
# survives losing one (rolled back to its last weight sync); a controller
# killed with SIGKILL mid-job and started again with its --state-dir
# finishes the job exactly as the uninterrupted reference run.
# Usage: $0 FUSIONRL_BINARY WORK_DIR
set -euo pipefail
BIN=$1
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT"
mkdir -p "$OUT"
CFG="$HERE/data/tiny.yaml"
SFT_CKPT="$OUT/sft/checkpoints/final"

# shellcheck source=cluster_lib.sh
source "$HERE/cluster_lib.sh"

# start_slowed_pair NAME: a controller NAME and workers on super nodes a and
# b, one thread each, b slowed by 150 ms a step (fault injection: timings
# only). Sets PAIR_ADDR and PAIR_PIDS (controller, worker a, worker b).
start_slowed_pair() {
  start_controller "$1"
  PAIR_ADDR=$CTL_ADDR
  PAIR_PIDS=("$CTL_PID")
  "$BIN" worker --controller "$PAIR_ADDR" --super-node a --threads 1 \
    >/dev/null 2>"$OUT/worker-a-$1.log" &
  PIDS+=("$!")
  PAIR_PIDS+=("$!")
  "$BIN" worker --controller "$PAIR_ADDR" --super-node b --threads 1 --debug-step-delay-ms 150 \
    >/dev/null 2>"$OUT/worker-b-$1.log" &
  PIDS+=("$!")
  PAIR_PIDS+=("$!")
}
# stop_part_way WHAT DIR: once the job writing DIR has 3 steps, SIGTERM to
# the pair's controller (the job ends after its current step with a
# checkpoint, CANCELLED); the controller and both workers exit 0. Sets
# STOPPED, the step the job ended after; a stop at the last step (20) would
# leave nothing to resume.
stop_part_way() {
  wait_steps "$2/metrics.jsonl" 3 120 "$1"
  kill -TERM "${PAIR_PIDS[0]}"
  wait_exit "${PAIR_PIDS[0]}" 60
  [ "$EXIT_RC" -eq 0 ] || fail "controller exit $EXIT_RC after SIGTERM (want 0 within 60 s)"
  local p
  for p in "${PAIR_PIDS[@]:1}"; do
    wait_exit "$p" 15
    [ "$EXIT_RC" -eq 0 ] || fail "worker $p exit $EXIT_RC after its controller shut down"
  done
  STOPPED=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["steps"] if s["interrupted"] else -1)' \
            "$2/summary.json")
  [ "$STOPPED" -ge 3 ] && [ "$STOPPED" -lt 20 ] ||
    fail "$1 stopped after step $STOPPED (want interrupted, 3 <= step < 20)"
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
# Heartbeat timeout 10 s: three busy processes share two cores here, and a
# shorter one (2 s) can declare a live but starved worker lost. The kill
# test below still sees the killed worker lost within 10 s.
start_controller controller --heartbeat-interval 0.5 --heartbeat-timeout 10
ctl_pid=$CTL_PID
ADDR=$CTL_ADDR
[ "$(wc -l < "$OUT/controller.out")" -eq 1 ] || fail "controller stdout is not one line: $(cat "$OUT/controller.out")"
echo "ok   controller listening on $ADDR"

# One thread per card, as each of the reference's two in-process workers
# gets (num_threads 1 / 2 super nodes, at least 1): with two threads the
# losses differ in the 7th digit (measured), and the comparison is exact.
"$BIN" worker --controller "$ADDR" --super-node a --threads 1 >"$OUT/worker-a.out" 2>"$OUT/worker-a.log" &
wa_pid=$!
PIDS+=("$wa_pid")
"$BIN" worker --controller "$ADDR" --super-node b --threads 1 >"$OUT/worker-b.out" 2>"$OUT/worker-b.log" &
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
sys.path.insert(0, out)
import checks
from checks import check

check(rc == 0, f"submit --wait exits 0 (got {rc})")
check(job.startswith("job-"), f"submit prints the job id ({job!r})")
st = json.load(open(os.path.join(out, "status-1.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"cluster job succeeded ({st['phase']})")
sub, trained = int(st["groups_submitted"]), int(st["groups_trained"])
check(sub == trained == 30 * 16, f"groups trained == submitted == 480 ({trained}/{sub})")
supers = sorted(n["super_node"] for n in st["nodes"])
check(supers == ["a", "b"], f"both super nodes in the job ({supers})")
check(all(n["state"] == "alive" for n in st["nodes"]), "both nodes alive")
# The controller data plane: the sums went through the controller, and the
# status says how much (the c10d job below must say 0).
check(int(st.get("controller_tensor_bytes", 0)) > 0,
      f"status: controller_tensor_bytes > 0 ({st.get('controller_tensor_bytes', 0)})")

ref = json.load(open(ref_path))
summary_path = os.path.join(out, "cluster", "summary.json")
check(os.path.exists(summary_path), "cluster summary.json written")
if os.path.exists(summary_path):
    clu = json.load(open(summary_path))
    check(clu["steps"] == 30, f"cluster summary: 30 steps ({clu['steps']})")
    # Exact: the same groups per card, one thread per card in both, and the
    # controller's cross-node sum of two payloads does not depend on order.
    for k in ("initial_eval_accuracy", "final_eval_accuracy", "final_train_reward", "rollout_tokens"):
        check(ref[k] == clu[k], f"summary {k}: cluster {clu[k]} == reference {ref[k]}")

rows = checks.rows(os.path.join(out, "cluster", "metrics.jsonl"))
check(len(rows) == 30 and [r["step"] for r in rows] == list(range(1, 31)),
      f"metrics.jsonl has steps 1..30 ({len(rows)} lines)")
check(all(r.get("nodes") == 2 for r in rows), "every step ran on 2 nodes")
ref_rows = checks.rows(os.path.join(out, "ref", "metrics.jsonl"))
diffs = checks.record_diffs(ref_rows, rows)
check(not diffs, f"every step record equals the reference's but for timings ({len(diffs)} differences)")
for d in diffs[:10]:
    print(f"     step {d[0]} {d[1]}: reference {d[2]!r}, cluster {d[3]!r}")
check(checks.same_bytes(os.path.join(out, "ref", "checkpoints", "final", "model.pt"),
                        os.path.join(out, "cluster", "checkpoints", "final", "model.pt")),
      "final model.pt is byte-identical to the reference's")
check(checks.optimizer_entries(os.path.join(out, "ref", "checkpoints", "final", "optim.pt")) ==
      checks.optimizer_entries(os.path.join(out, "cluster", "checkpoints", "final", "optim.pt")),
      "final optimizer state holds the same tensors as the reference's")
ok, text = checks.groups_once(rows, 16)
check(ok, f"the cards trained every prompt group once ({text})")
checks.finish()
PY

# 3b. The c10d data plane: the same job, its gradients summed in a Gloo
#     group of the two worker processes (rendezvous through the controller's
#     store). Same run bit for bit (a two-term sum is order-free), and the
#     controller carries no tensor bytes.
c10d_rc=0
job1c=$(timeout 300 "$BIN" submit "$CFG" --controller "$ADDR" \
       --set placement.super_nodes=2 --set run.total_steps=30 --set run.eval_every=0 \
       --set run.data_plane=c10d \
       --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/cluster-c10d" --wait \
       2>"$OUT/submit-1c.log") || c10d_rc=$?
"$BIN" status --controller "$ADDR" --job "$job1c" --json >"$OUT/status-1c.json"
python3 - "$c10d_rc" "$OUT" <<'PY'
import json, os, sys
rc, out = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, out)
import checks
from checks import check
check(rc == 0, f"c10d data plane: submit --wait exits 0 (got {rc})")
st = json.load(open(os.path.join(out, "status-1c.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"c10d job succeeded ({st['phase']} {st.get('message', '')!r})")
check(int(st.get("controller_tensor_bytes", 0)) == 0,
      f"status: controller_tensor_bytes == 0 ({st.get('controller_tensor_bytes', 0)})")
rows = checks.rows(os.path.join(out, "cluster-c10d", "metrics.jsonl"))
ref_rows = checks.rows(os.path.join(out, "ref", "metrics.jsonl"))
check(all(r.get("controller_tensor_bytes") == 0 for r in rows) and len(rows) == 30,
      "every record: controller_tensor_bytes == 0")
check(all(r.get("controller_tensor_bytes", 0) > 0 for r in ref_rows),
      "the reference (controller data plane) sent its sums through the controller")
diffs = [d for d in checks.record_diffs(ref_rows, rows) if d[1] != "controller_tensor_bytes"]
check(not diffs, f"every step record equals the reference's but for timings ({len(diffs)} differences)")
for d in diffs[:10]:
    print(f"     step {d[0]} {d[1]}: reference {d[2]!r}, c10d {d[3]!r}")
check(checks.same_bytes(os.path.join(out, "ref", "checkpoints", "final", "model.pt"),
                        os.path.join(out, "cluster-c10d", "checkpoints", "final", "model.pt")),
      "final model.pt is byte-identical to the reference's")
ok, text = checks.groups_once(rows, 16)
check(ok, f"the cards trained every prompt group once ({text})")
checks.finish()
PY

# 4. SIGKILL a worker mid-job (on the c10d data plane): the survivor's
#    collective fails, the controller declares the worker lost, re-queues
#    its prompt groups and finishes the job on the worker left.
job2=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR" \
       --set placement.super_nodes=2 --set run.total_steps=40 --set run.eval_every=0 \
       --set run.data_plane=c10d \
       --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/kill" 2>"$OUT/submit-2.log")
wait_steps "$OUT/kill/metrics.jsonl" 5 120 "$job2"
kill_hard "$wb_pid"
steps_at_kill=$(wc -l < "$OUT/kill/metrics.jsonl")
echo "ok   killed worker b (SIGKILL) after $steps_at_kill steps of $job2"

wait_job "$ADDR" "$job2" "$OUT/status-2.json" 300

python3 - "$OUT" "$steps_at_kill" <<'PY'
import json, os, sys
out, at_kill = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, out)
import checks
from checks import check

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

rows = checks.rows(os.path.join(out, "kill", "metrics.jsonl"))
steps = [r["step"] for r in rows]
# The workers' side of the ledger: what the cards actually trained, summed
# over the committed steps (an aborted attempt leaves no record).
ok, text = checks.groups_once(rows, 16)
check(ok, f"the cards trained every prompt group exactly once ({text})")
check(all(r["trained_groups"] == 16 for r in rows), "every committed step trained 16 groups")
check(len(rows) == 40 and sorted(steps) == list(range(1, 41)),
      f"metrics.jsonl has steps 1..40 exactly once ({len(rows)} lines)")
nodes = [r.get("nodes") for r in rows]
check(all(n == 2 for n in nodes[:5]), "steps before the kill ran on 2 nodes")
# The step in flight at the kill may have just finished on both; every later one runs on a.
later = [r.get("nodes") for r in rows if r["step"] > at_kill + 1]
check(later and all(n == 1 for n in later), f"steps after {at_kill + 1} ran on 1 node")
check(nodes == sorted(nodes, reverse=True), "node count never grows back")
check(int(st.get("controller_tensor_bytes", 0)) == 0,
      f"c10d data plane: controller_tensor_bytes == 0 ({st.get('controller_tensor_bytes', 0)})")
summary_path = os.path.join(out, "kill", "summary.json")
check(os.path.exists(summary_path), "summary.json written")
if os.path.exists(summary_path):
    check(json.load(open(summary_path))["steps"] == 40, "summary.json: 40 steps")
checks.finish()
PY

# 5. SIGTERM the controller while a job runs: the job stops after its
#    current step with a checkpoint (CANCELLED, resumable), the controller
#    tells the workers to exit; both exit 0.
drain_id=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR" \
  --set run.total_steps=100000 --set run.eval_every=0 \
  --set init_checkpoint="$SFT_CKPT" \
  --output-dir "$OUT/drain" 2>>"$OUT/submit.log")
wait_steps "$OUT/drain/metrics.jsonl" 3 120 "the drain job ($drain_id)"
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
sys.path.insert(0, os.path.dirname(out))
import checks
from checks import check
s = json.load(open(os.path.join(out, "summary.json")))
rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
check(s["interrupted"] is True, "drained job is marked interrupted")
ok, text = checks.groups_once(rows, 16)
check(ok, f"the cards trained every prompt group once up to the stop ({text})")
check(s["steps"] == len(rows) and s["steps"] >= 3,
      f"summary steps == metrics lines ({s['steps']} / {len(rows)})")
ck = os.path.join(out, "checkpoints", f"step_{s['steps']}")
check(s["checkpoint_dir"] == ck and os.path.exists(os.path.join(ck, "model.pt")),
      f"checkpoint of the last step written ({os.path.basename(ck)})")
checks.finish()
PY

# 6. StaleSync across super nodes (max_clock_skew k = 1) on a fresh cluster
#    whose worker b is slowed down (fault injection): worker a runs ahead,
#    but the two clocks never drift more than k + 1 = 2 apart, and after the
#    final sync both super nodes hold the same weights (CRC-32C per super
#    node in summary.json).
start_slowed_pair controller-2
ADDR2=$PAIR_ADDR
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
sys.path.insert(0, out)
import checks
from checks import check
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
skews = [r["clock_skew"] for r in rows]
check(all(0 <= k <= 2 for k in skews), f"clock_skew <= 2 at every commit ({skews})")
# The slowed node really lagged, and because it is slowed, not by chance:
# measured 17 of 20 commits with the clocks apart (all but the two syncs'
# steps and one) in three runs, 0 to 3 of 20 in three runs without
# --debug-step-delay-ms (where the summary's max seen was still 1 or 2, so
# that alone would not tell).
lagged = sum(k >= 1 for k in skews)
check(lagged >= 10, f"the slowed super node lagged at {lagged} of 20 commits (want >= 10)")
check(all(r.get("max_clock_skew_seen", -1) <= seen for r in rows), "no record exceeds the summary's max skew")
check(max(r["max_update_lag"] for r in rows) <= 1, "no update applied more than k = 1 step late")
check(sum(r["updates_received"] for r in rows) == 20, "the lead applied each of b's 20 updates once")
syncs = [r["step"] for r in rows if r["weight_sync_bytes"] > 0]
check(syncs == [10, 20], f"weights synced at the checkpoint and the end ({syncs})")
# Both super nodes' cards report what they trained; the record sums them.
ok, text = checks.groups_once(rows, 16)
check(ok, f"the cards of both super nodes trained every prompt group once ({text})")
print(f"     final eval accuracy {s['final_eval_accuracy']:.3f} (start {s['initial_eval_accuracy']:.3f})")
checks.finish()
PY

# 6b. The same StaleSync job on the c10d data plane: each update goes into
#     an asynchronous all-reduce of the two worker processes that the other
#     super node waits for k = 1 step later, and the syncs are broadcasts.
#     What a node applies depends on no arrival order, so the slowed
#     cluster ends with the weights of the same job run in one process
#     bit for bit, and the controller carries no tensor bytes.
skew_ref=$(timeout 300 "$BIN" run "$CFG" --output-dir "$OUT/skew-c10d-ref" --init-checkpoint "$SFT_CKPT" \
           --set placement.super_nodes=2 --set stalesync.max_clock_skew=1 --set run.data_plane=c10d \
           --set run.total_steps=20 --set run.checkpoint_every=10 --set run.eval_every=0 \
           2>"$OUT/skew-c10d-ref.log") || fail "in-process StaleSync c10d run failed: $(tail -5 "$OUT/skew-c10d-ref.log")"
echo "ok   in-process StaleSync run on the c10d data plane ($skew_ref)"
skewc_rc=0
job3c=$(timeout 300 "$BIN" submit "$CFG" --controller "$ADDR2" \
       --set placement.super_nodes=2 --set stalesync.max_clock_skew=1 --set run.data_plane=c10d \
       --set run.total_steps=20 --set run.checkpoint_every=10 --set run.eval_every=0 \
       --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/skew-c10d" --wait \
       2>"$OUT/submit-3c.log") || skewc_rc=$?
"$BIN" status --controller "$ADDR2" --job "$job3c" --json >"$OUT/status-3c.json"
python3 - "$skewc_rc" "$OUT" <<'PY' || fail "StaleSync on the c10d data plane"
import json, os, sys
rc, out = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, out)
import checks
from checks import check
check(rc == 0, f"StaleSync k=1 on c10d: submit --wait exits 0 (got {rc})")
st = json.load(open(os.path.join(out, "status-3c.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"StaleSync c10d job succeeded ({st['phase']} {st.get('message', '')!r})")
check(int(st.get("controller_tensor_bytes", 0)) == 0,
      f"status: controller_tensor_bytes == 0 ({st.get('controller_tensor_bytes', 0)})")
s = json.load(open(os.path.join(out, "skew-c10d", "summary.json")))
seen = s.get("max_clock_skew_seen", -1)
check(0 <= seen <= 2, f"clocks never more than k+1 = 2 apart (max seen {seen})")
crc = s.get("final_weights_crc32c", {})
check(sorted(crc) == ["a", "b"] and len(set(crc.values())) == 1,
      f"after the broadcast sync both super nodes hold identical weights ({crc})")
rows = checks.rows(os.path.join(out, "skew-c10d", "metrics.jsonl"))
check([r["step"] for r in rows] == list(range(1, 21)), f"metrics.jsonl has steps 1..20 ({len(rows)} lines)")
check(all(r.get("controller_tensor_bytes") == 0 for r in rows), "every record: controller_tensor_bytes == 0")
check(max(r["max_update_lag"] for r in rows) <= 1, "no update applied more than k = 1 step late")
check(sum(r["updates_received"] for r in rows) == 20, "the lead applied each of b's 20 updates once")
syncs = [r["step"] for r in rows if r["weight_sync_bytes"] > 0]
check(syncs == [10, 20], f"weights synced at the checkpoint and the end ({syncs})")
ok, text = checks.groups_once(rows, 16)
check(ok, f"the cards of both super nodes trained every prompt group once ({text})")
ref = checks.rows(os.path.join(out, "skew-c10d-ref", "metrics.jsonl"))
timing_dependent = {"clock_skew", "max_clock_skew_seen"}
diffs = [d for d in checks.record_diffs(ref, rows) if d[1] not in timing_dependent]
check(not diffs, f"every step record equals the in-process run's but for timings and skew ({len(diffs)} differences)")
for d in diffs[:10]:
    print(f"     step {d[0]} {d[1]}: in-process {d[2]!r}, cluster {d[3]!r}")
check(checks.same_bytes(os.path.join(out, "skew-c10d-ref", "checkpoints", "final", "model.pt"),
                        os.path.join(out, "skew-c10d", "checkpoints", "final", "model.pt")),
      "final model.pt is byte-identical to the in-process run's, however the slowed node's timing fell")
checks.finish()
PY

# 7. submit --resume is exact. On the same cluster (worker b still slowed,
#    which changes timings only), the job of section 3 runs once through
#    ($OUT/whole), then again ($OUT/resume) stopped part way by SIGTERM to
#    the controller (the job ends after its current step with a checkpoint,
#    CANCELLED), then resubmitted with --resume to a fresh controller and
#    workers started with the same flags. Every step record and the final
#    weights equal those of the uninterrupted run.
JOB_ARGS=(--set placement.super_nodes=2 --set run.total_steps=20 --set run.eval_every=0
          --set init_checkpoint="$SFT_CKPT")
whole_rc=0
timeout 300 "$BIN" submit "$CFG" --controller "$ADDR2" "${JOB_ARGS[@]}" \
  --output-dir "$OUT/whole" --wait >/dev/null 2>"$OUT/submit-whole.log" || whole_rc=$?
[ "$whole_rc" -eq 0 ] || fail "uninterrupted job: submit --wait exit $whole_rc"
timeout 60 "$BIN" submit "$CFG" --controller "$ADDR2" "${JOB_ARGS[@]}" \
  --output-dir "$OUT/resume" >/dev/null 2>"$OUT/submit-resume-1.log"
stop_part_way "the job to resume" "$OUT/resume"
stopped=$STOPPED
echo "ok   the job to resume stopped after step $stopped of 20 (SIGTERM to the controller)"

start_slowed_pair controller-3
ADDR3=$PAIR_ADDR
resume_rc=0
timeout 300 "$BIN" submit "$CFG" --controller "$ADDR3" "${JOB_ARGS[@]}" \
  --output-dir "$OUT/resume" --resume --wait >/dev/null 2>"$OUT/submit-resume-2.log" || resume_rc=$?
python3 - "$resume_rc" "$OUT" "$stopped" <<'PY' || fail "submit --resume checks"
import json, os, sys
rc, out, stopped = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
sys.path.insert(0, out)
import checks
from checks import check
check(rc == 0, f"submit --resume --wait exits 0 (got {rc})")
whole = json.load(open(os.path.join(out, "whole", "summary.json")))
res = json.load(open(os.path.join(out, "resume", "summary.json")))
check(res["interrupted"] is False and res["resumed_from_step"] == stopped and res["steps"] == 20,
      f"resumed from step {stopped} to 20 ({res['resumed_from_step']}, {res['steps']}, interrupted {res['interrupted']})")
a, b = whole["final_eval_accuracy"], res["final_eval_accuracy"]
check(a == b, f"final eval accuracy: resumed {b} == uninterrupted {a}")
check(whole["final_train_reward"] == res["final_train_reward"], "final train reward equal")
w_rows = checks.rows(os.path.join(out, "whole", "metrics.jsonl"))
r_rows = checks.rows(os.path.join(out, "resume", "metrics.jsonl"))
check([r["step"] for r in r_rows] == list(range(1, 21)), f"resumed metrics.jsonl has steps 1..20 once ({len(r_rows)} lines)")
# controller_tensor_bytes counts the StaleSync updates through the
# controller as they are handed in: when a step commits, a node ahead has
# already sent updates of later steps, so the running count at a commit
# depends on timing here (it is exact in synchronous jobs).
diffs = [d for d in checks.record_diffs(w_rows, r_rows) if d[1] != "controller_tensor_bytes"]
check(not diffs, f"every step record equals the uninterrupted run's but for timings ({len(diffs)} differences)")
for d in diffs[:10]:
    print(f"     step {d[0]} {d[1]}: uninterrupted {d[2]!r}, resumed {d[3]!r}")
print("     reward_mean per step: " + " ".join(f"{r['reward_mean']:.4f}" for r in r_rows))
check(checks.same_bytes(os.path.join(out, "whole", "checkpoints", "final", "model.pt"),
                        os.path.join(out, "resume", "checkpoints", "final", "model.pt")),
      "final model.pt is byte-identical to the uninterrupted run's")
check(checks.optimizer_entries(os.path.join(out, "whole", "checkpoints", "final", "optim.pt")) ==
      checks.optimizer_entries(os.path.join(out, "resume", "checkpoints", "final", "optim.pt")),
      "final optimizer state holds the same tensors as the uninterrupted run's")
ok, text = checks.groups_once(r_rows, 16)
check(ok, f"across the stop and the resume every prompt group trained once ({text})")
checks.finish()
PY

# 7b. The same through worker processes for RL Fusion with StaleSync
#     (fused, max_policy_lag 2): every card keeps, next to the end
#     checkpoint, the batches its rollout thread sampled ahead from older
#     versions (checkpoints/rollout/), and the resumed cards continue that
#     pipeline, so the resumed job equals the uninterrupted one record for
#     record and byte for byte.
FUSED_ARGS=("${JOB_ARGS[@]}" --set placement.mode=fused --set stalesync.max_policy_lag=2
            --set algorithm.decoupled_loss=true)
fwhole_rc=0
timeout 300 "$BIN" submit "$CFG" --controller "$ADDR3" "${FUSED_ARGS[@]}" \
  --output-dir "$OUT/whole-fused" --wait >/dev/null 2>"$OUT/submit-whole-fused.log" || fwhole_rc=$?
[ "$fwhole_rc" -eq 0 ] || fail "uninterrupted fused job: submit --wait exit $fwhole_rc"
timeout 60 "$BIN" submit "$CFG" --controller "$ADDR3" "${FUSED_ARGS[@]}" \
  --output-dir "$OUT/resume-fused" >/dev/null 2>"$OUT/submit-resume-fused-1.log"
stop_part_way "the fused job to resume" "$OUT/resume-fused"
fstopped=$STOPPED
ls "$OUT/resume-fused/checkpoints/rollout/step_$fstopped/"card_*.pb >/dev/null 2>&1 ||
  fail "no rollout prefetch files next to the fused job's end checkpoint (step $fstopped)"
echo "ok   the fused job stopped after step $fstopped of 20 with its cards' prefetch files"
start_slowed_pair controller-3b
ADDR3B=$PAIR_ADDR
fresume_rc=0
timeout 300 "$BIN" submit "$CFG" --controller "$ADDR3B" "${FUSED_ARGS[@]}" \
  --output-dir "$OUT/resume-fused" --resume --wait >/dev/null 2>"$OUT/submit-resume-fused-2.log" ||
  fresume_rc=$?
python3 - "$fresume_rc" "$OUT" "$fstopped" <<'PY' || fail "fused submit --resume checks"
import json, os, sys
rc, out, stopped = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
sys.path.insert(0, out)
import checks
from checks import check
check(rc == 0, f"fused submit --resume --wait exits 0 (got {rc})")
res = json.load(open(os.path.join(out, "resume-fused", "summary.json")))
check(res["interrupted"] is False and res["resumed_from_step"] == stopped and res["steps"] == 20,
      f"fused job resumed from step {stopped} to 20 ({res['resumed_from_step']}, {res['steps']})")
w_rows = checks.rows(os.path.join(out, "whole-fused", "metrics.jsonl"))
r_rows = checks.rows(os.path.join(out, "resume-fused", "metrics.jsonl"))
check([r["step"] for r in r_rows] == list(range(1, 21)), f"resumed metrics.jsonl has steps 1..20 once ({len(r_rows)} lines)")
check(max(r["max_staleness"] for r in r_rows) == 2 and max(r["over_stale_samples"] for r in r_rows) == 0,
      "samples up to 2 versions old were trained, none over the lag before the filter")
# The rollout thread's counters and the card's at-once/in-turns mode follow
# the process, not the run.
process_dependent = {"rollout_snapshot_updates", "card_turns_interleaved"}
diffs = [d for d in checks.record_diffs(w_rows, r_rows) if d[1] not in process_dependent]
check(not diffs, f"every step record equals the uninterrupted fused run's but for timings ({len(diffs)} differences)")
for d in diffs[:10]:
    print(f"     step {d[0]} {d[1]}: uninterrupted {d[2]!r}, resumed {d[3]!r}")
check(checks.same_bytes(os.path.join(out, "whole-fused", "checkpoints", "final", "model.pt"),
                        os.path.join(out, "resume-fused", "checkpoints", "final", "model.pt")),
      "final model.pt is byte-identical to the uninterrupted fused run's")
ok, text = checks.groups_once(r_rows, 16)
check(ok, f"across the stop and the resume every prompt group trained once ({text})")
checks.finish()
PY

# 8. Four worker processes on the c10d data plane (k = 0): the nodes' first
#    cards all-reduce in one Gloo group of four processes. The run equals
#    the same job in one process with four in-process super nodes bit for
#    bit (the same ring over the same four ranks), and no tensor byte goes
#    through the controller.
four_ref=$(timeout 300 "$BIN" run "$CFG" --output-dir "$OUT/four-ref" --init-checkpoint "$SFT_CKPT" \
           --set placement.super_nodes=4 --set run.data_plane=c10d \
           --set run.total_steps=8 --set run.eval_every=0 \
           2>"$OUT/four-ref.log") || fail "in-process 4-super-node run failed: $(tail -5 "$OUT/four-ref.log")"
echo "ok   in-process run on 4 super nodes ($four_ref)"
start_controller controller-4 --heartbeat-interval 0.5 --heartbeat-timeout 10
ADDR4=$CTL_ADDR
declare -A W4_PID
for sn in a b c d; do
  "$BIN" worker --controller "$ADDR4" --super-node "$sn" --threads 1 >/dev/null 2>"$OUT/worker-$sn-4.log" &
  PIDS+=("$!")
  W4_PID[$sn]=$!
done
four_rc=0
job4=$(timeout 300 "$BIN" submit "$CFG" --controller "$ADDR4" \
       --set placement.super_nodes=4 --set run.data_plane=c10d \
       --set run.total_steps=8 --set run.eval_every=0 \
       --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/four" --wait \
       2>"$OUT/submit-4.log") || four_rc=$?
"$BIN" status --controller "$ADDR4" --job "$job4" --json >"$OUT/status-4.json"
python3 - "$four_rc" "$OUT" <<'PY' || fail "four worker processes on c10d"
import json, os, sys
rc, out = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, out)
import checks
from checks import check
check(rc == 0, f"4 workers on c10d: submit --wait exits 0 (got {rc})")
st = json.load(open(os.path.join(out, "status-4.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"4-worker job succeeded ({st['phase']} {st.get('message', '')!r})")
supers = sorted(n["super_node"] for n in st["nodes"])
check(supers == ["a", "b", "c", "d"], f"all four super nodes in the job ({supers})")
check(int(st.get("controller_tensor_bytes", 0)) == 0,
      f"status: controller_tensor_bytes == 0 ({st.get('controller_tensor_bytes', 0)})")
rows = checks.rows(os.path.join(out, "four", "metrics.jsonl"))
ref = checks.rows(os.path.join(out, "four-ref", "metrics.jsonl"))
check(len(rows) == 8 and all(r.get("controller_tensor_bytes") == 0 for r in rows),
      "8 records, each with controller_tensor_bytes == 0")
diffs = checks.record_diffs(ref, rows)
check(not diffs, f"every step record equals the in-process run's but for timings ({len(diffs)} differences)")
for d in diffs[:10]:
    print(f"     step {d[0]} {d[1]}: in-process {d[2]!r}, 4 workers {d[3]!r}")
check(checks.same_bytes(os.path.join(out, "four-ref", "checkpoints", "final", "model.pt"),
                        os.path.join(out, "four", "checkpoints", "final", "model.pt")),
      "final model.pt is byte-identical to the in-process run's")
ok, text = checks.groups_once(rows, 16)
check(ok, f"the cards trained every prompt group once ({text})")
checks.finish()
PY

# 9. StaleSync (k = 1) on the c10d data plane loses a super node: SIGKILL
#    worker d while the job runs. The survivors roll back to the last
#    weight sync (checkpoint every 4 steps), the steps after it run again on
#    three super nodes, and the job succeeds with every step recorded once,
#    every prompt group trained once (ledger), equal weights on the three survivors
#    and no tensor byte through the controller. 12 groups a step: 3 per
#    card on 4 super nodes, 4 on 3.
job9=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR4" \
       --set placement.super_nodes=4 --set run.data_plane=c10d \
       --set stalesync.max_clock_skew=1 --set rollout.prompts_per_step=12 \
       --set run.total_steps=16 --set run.checkpoint_every=4 --set run.eval_every=0 \
       --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/skew-kill" 2>"$OUT/submit-9.log")
wait_steps "$OUT/skew-kill/metrics.jsonl" 6 180 "$job9"
kill_hard "${W4_PID[d]}"
steps_at_kill9=$(wc -l < "$OUT/skew-kill/metrics.jsonl")
echo "ok   killed worker d (SIGKILL) after $steps_at_kill9 steps of $job9 (k = 1, c10d)"
wait_job "$ADDR4" "$job9" "$OUT/status-9.json" 300
python3 - "$OUT" <<'PY' || fail "StaleSync roll-back after a lost super node"
import json, os, sys
out = sys.argv[1]
sys.path.insert(0, out)
import checks
from checks import check
st = json.load(open(os.path.join(out, "status-9.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"k = 1 job survives the lost super node ({st['phase']} {st.get('message', '')!r})")
check(int(st["step"]) == 16, f"step 16 ({st['step']})")
sub, trained = int(st["groups_submitted"]), int(st["groups_trained"])
check(sub == trained == 16 * 12, f"groups trained == submitted == 192 ({trained}/{sub})")
texts = [e["text"] for e in st.get("events", [])]
for t in texts:
    if "roll-back" in t or "lost" in t:
        print(f"     event: {t}")
check(any("roll-back" in t and "back to the weight sync of step" in t for t in texts),
      "an event reports the roll-back to the last weight sync")
check(int(st.get("controller_tensor_bytes", 0)) == 0,
      f"controller_tensor_bytes == 0 ({st.get('controller_tensor_bytes', 0)})")
rows = checks.rows(os.path.join(out, "skew-kill", "metrics.jsonl"))
steps = [r["step"] for r in rows]
check(steps == list(range(1, 17)), f"metrics.jsonl has steps 1..16 once, in order ({steps})")
# The records' trained groups are every super node's (each super node's
# first card reports its own), so the cards' own counts cover the job too.
ok, text = checks.groups_once(rows, 12)
check(ok, f"the cards of every super node trained every prompt group once ({text})")
check(rows[-1].get("nodes") == 3, f"the last step ran on 3 super nodes ({rows[-1].get('nodes')})")
check(all(r.get("controller_tensor_bytes") == 0 for r in rows), "every record: controller_tensor_bytes == 0")
summary = json.load(open(os.path.join(out, "skew-kill", "summary.json")))
crcs = summary.get("final_weights_crc32c", {})
check(sorted(crcs) == ["a", "b", "c"] and len(set(crcs.values())) == 1,
      f"the three survivors end with equal weights ({crcs})")
checks.finish()
PY

# 10. SIGKILL the controller mid-job; start it again on the same address
#     with the same --state-dir. The workers keep their state and retry
#     (--reconnect-timeout), keep their node ids, and the job continues
#     from its last committed step: the two-node step in flight is
#     replanned (the nodes restore its start), so the run equals the
#     uninterrupted in-process reference of section 2 step for step and
#     byte for byte, and every prompt group is trained once.
start_controller controller-5 --heartbeat-interval 0.5 --heartbeat-timeout 10 --state-dir "$OUT/state"
ADDR5=$CTL_ADDR
ctl5_pid=$CTL_PID
for sn in a b; do
  "$BIN" worker --controller "$ADDR5" --super-node "$sn" --threads 1 --reconnect-timeout 60 \
    >/dev/null 2>"$OUT/worker-$sn-5.log" &
  PIDS+=("$!")
done
job10=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR5" \
        --set placement.super_nodes=2 --set run.total_steps=30 --set run.eval_every=0 \
        --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/restart" 2>"$OUT/submit-10.log")
wait_steps "$OUT/restart/metrics.jsonl" 8 180 "$job10"
logs5=("$OUT/worker-a-5.log" "$OUT/worker-b-5.log")
marks=$(outage_marks "${logs5[@]}")
kill_hard "$ctl5_pid"
steps_at_kill10=$(wc -l < "$OUT/restart/metrics.jsonl")
echo "ok   killed the controller (SIGKILL) after $steps_at_kill10 steps of $job10"
wait_outage 30 "$marks" "${logs5[@]}"
echo "ok   both workers saw the controller go away"
CTL_LISTEN=$ADDR5 start_controller controller-5b --heartbeat-interval 0.5 --heartbeat-timeout 10 --state-dir "$OUT/state"
ctl5b_pid=$CTL_PID
echo "ok   controller restarted on $ADDR5 with its --state-dir"
wait_job "$ADDR5" "$job10" "$OUT/status-10.json" 300
python3 - "$OUT" "$steps_at_kill10" <<'PY' || fail "controller restart"
import json, os, sys
out, at_kill = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, out)
import checks
from checks import check
st = json.load(open(os.path.join(out, "status-10.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"the job survives the controller's SIGKILL ({st['phase']} {st.get('message', '')!r})")
sub, trained = int(st["groups_submitted"]), int(st["groups_trained"])
check(sub == trained == 30 * 16, f"groups trained == submitted == 480 ({trained}/{sub})")
check(sorted(n["super_node"] for n in st["nodes"]) == ["a", "b"] and
      all(n["state"] == "alive" for n in st["nodes"]), "both nodes kept their ids and are alive")
texts = [e["text"] for e in st.get("events", [])]
for t in texts:
    if "restarted" in t:
        print(f"     event: {t}")
check(any("controller restarted" in t for t in texts), "an event reports the restart")
rows = checks.rows(os.path.join(out, "restart", "metrics.jsonl"))
check([r["step"] for r in rows] == list(range(1, 31)), f"metrics.jsonl has steps 1..30 once ({len(rows)} lines)")
ok, text = checks.groups_once(rows, 16)
check(ok, f"the cards trained every prompt group once ({text})")
ref = checks.rows(os.path.join(out, "ref", "metrics.jsonl"))
# The replanned step says attempt 2, and its re-sent sums went through the
# controller twice; everything else is the uninterrupted run's.
diffs = [d for d in checks.record_diffs(ref, rows) if d[1] not in ("attempt", "controller_tensor_bytes")]
check(not diffs, f"every step record equals the uninterrupted reference's but for timings ({len(diffs)} differences)")
for d in diffs[:10]:
    print(f"     step {d[0]} {d[1]}: reference {d[2]!r}, restarted {d[3]!r}")
check(checks.same_bytes(os.path.join(out, "ref", "checkpoints", "final", "model.pt"),
                        os.path.join(out, "restart", "checkpoints", "final", "model.pt")),
      "final model.pt is byte-identical to the uninterrupted run's")
checks.finish()
PY

# 10b. The same with RL Fusion and StaleSync across the two super nodes
#      (placement fused, policy lag 1, clock skew 1, weight syncs at the
#      checkpoints every 4 steps): the restarted controller rolls the job
#      back to its last weight sync, and it ends with every step recorded
#      once, every prompt group trained once and equal weights on both.
job10b=$(timeout 60 "$BIN" submit "$CFG" --controller "$ADDR5" \
         --set placement.super_nodes=2 --set placement.mode=fused \
         --set stalesync.max_policy_lag=1 --set algorithm.decoupled_loss=true \
         --set stalesync.max_clock_skew=1 --set run.checkpoint_every=4 \
         --set run.total_steps=16 --set run.eval_every=0 \
         --set init_checkpoint="$SFT_CKPT" --output-dir "$OUT/restart-skew" 2>"$OUT/submit-10b.log")
wait_steps "$OUT/restart-skew/metrics.jsonl" 6 180 "$job10b"
marks=$(outage_marks "${logs5[@]}")
kill_hard "$ctl5b_pid"
echo "ok   killed the controller (SIGKILL) during $job10b (fused, lag 1, skew 1)"
wait_outage 30 "$marks" "${logs5[@]}"
echo "ok   both workers saw the controller go away"
CTL_LISTEN=$ADDR5 start_controller controller-5c --heartbeat-interval 0.5 --heartbeat-timeout 10 --state-dir "$OUT/state"
wait_job "$ADDR5" "$job10b" "$OUT/status-10b.json" 300
python3 - "$OUT" <<'PY' || fail "controller restart of a fused StaleSync job"
import json, os, sys
out = sys.argv[1]
sys.path.insert(0, out)
import checks
from checks import check
st = json.load(open(os.path.join(out, "status-10b.json")))
check(st["phase"] == "JOB_PHASE_SUCCEEDED", f"fused StaleSync job survives the controller's SIGKILL ({st['phase']} {st.get('message', '')!r})")
sub, trained = int(st["groups_submitted"]), int(st["groups_trained"])
check(sub == trained == 16 * 16, f"groups trained == submitted == 256 ({trained}/{sub})")
texts = [e["text"] for e in st.get("events", [])]
for t in texts:
    if "restarted" in t:
        print(f"     event: {t}")
check(any("controller restarted" in t for t in texts), "an event reports the restart and roll-back")
rows = checks.rows(os.path.join(out, "restart-skew", "metrics.jsonl"))
check([r["step"] for r in rows] == list(range(1, 17)), f"metrics.jsonl has steps 1..16 once ({len(rows)} lines)")
check(max(r.get("max_staleness", 0) for r in rows) <= 1, "no sample trained above the policy lag")
crcs = json.load(open(os.path.join(out, "restart-skew", "summary.json"))).get("final_weights_crc32c", {})
check(sorted(crcs) == ["a", "b"] and len(set(crcs.values())) == 1, f"both super nodes end with equal weights ({crcs})")
if checks.failures:
    # What the controller saw: every event and where each node ended.
    for t in texts:
        print(f"     event: {t}")
    for n in st.get("nodes", []):
        print(f"     node: {n.get('node_id', '?')} super node {n.get('super_node')} {n.get('state')}")
checks.finish()
PY


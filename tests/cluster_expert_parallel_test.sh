#!/usr/bin/env bash
# Expert parallelism across worker processes: two workers of one super
# node, one card each, hold half of a MoE policy's experts each
# (placement.expert_parallel 2; the expert group is formed through the
# controller's store, its all-to-alls go between the processes). The job
# equals the same job run in one process (one worker holding both cards and
# a local expert group) record for record and byte for byte (model.pt, both
# shards' optimizer states); `submit --resume` from its middle checkpoint
# ends at the same bytes; RL Fusion with each card sampling from its own
# shard in lockstep across the processes (expert_sampling shard) equals
# the gathered in-process run (its checkpoint's experts written per shard);
# and a worker killed mid-job fails the job at once
# with a message that names the expert group and the way on (--resume),
# never a hang.
# Usage: $0 FUSIONRL_BINARY WORK_DIR
set -euo pipefail
BIN=$1
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT"
mkdir -p "$OUT"
# shellcheck source=cluster_lib.sh
source "$HERE/cluster_lib.sh"

cat >"$OUT/job.yaml" <<YAML
name: ep-processes
seed: 1
device: cpu
num_threads: 2
output_dir: $OUT/unused
model: {d_model: 64, n_layers: 2, n_heads: 4, d_ff: 128, max_seq_len: 32,
        moe_experts: 4, moe_top_k: 2}
task: {name: reverse, eval_size: 20, min_digits: 3, max_digits: 5}
rollout: {prompts_per_step: 8, group_size: 4, max_new_tokens: 7}
algorithm: {kl_coef: 0.05}
optim: {lr: 1.0e-3}
run: {total_steps: 4, eval_every: 0, checkpoint_every: 2}
placement: {cards_per_super_node: 2, expert_parallel: 2}
YAML

# 1. Reference: one process, one worker with both cards (a local group;
#    num_threads 2 gives each card one thread, as each worker below has).
timeout 120 "$BIN" run "$OUT/job.yaml" -o "$OUT/ref" >/dev/null 2>"$OUT/ref.log" ||
  fail "in-process reference run failed: $(tail -3 "$OUT/ref.log")"
echo "ok   in-process reference (one worker, two cards, E = 2)"

# 2. The same job on two worker processes of super node a.
start_controller controller --heartbeat-timeout 10
ADDR=$CTL_ADDR
for w in 1 2; do
  "$BIN" worker --controller "$ADDR" --super-node a --threads 1 >/dev/null 2>"$OUT/worker-$w.log" &
  PIDS+=("$!")
done
WORKER_PIDS=("${PIDS[@]:1}")
deadline=$((SECONDS + 30))
until grep -q 'registered as' "$OUT/worker-1.log" && grep -q 'registered as' "$OUT/worker-2.log"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "workers did not register in 30 s"
  sleep 0.2
done
timeout 120 "$BIN" submit "$OUT/job.yaml" --controller "$ADDR" --output-dir "$OUT/cluster" \
  --wait >/dev/null 2>"$OUT/submit.log" || fail "cluster job failed: $(tail -3 "$OUT/submit.log")"
echo "ok   the job on two worker processes"

# 3. Resumed from its step-2 checkpoint on the same workers.
mkdir -p "$OUT/resume/checkpoints"
cp -r "$OUT/cluster/checkpoints/step_2" "$OUT/resume/checkpoints/"
timeout 120 "$BIN" submit "$OUT/job.yaml" --controller "$ADDR" --output-dir "$OUT/resume" \
  --resume --wait >/dev/null 2>"$OUT/submit-resume.log" ||
  fail "resumed cluster job failed: $(tail -3 "$OUT/submit-resume.log")"
echo "ok   the job resumed from step 2 on two worker processes"

# 3b. RL Fusion with lag 1, each card sampling from its own shard in
#     lockstep across the processes (placement.expert_sampling shard: the
#     rollout threads' group is formed through the store too), against the
#     same job sampling from gathered copies in one process.
FUSED=(--set placement.mode=fused --set stalesync.max_policy_lag=1
       --set algorithm.decoupled_loss=true)
timeout 120 "$BIN" run "$OUT/job.yaml" -o "$OUT/fused-ref" "${FUSED[@]}" >/dev/null \
  2>"$OUT/fused-ref.log" || fail "in-process fused run failed: $(tail -3 "$OUT/fused-ref.log")"
fused_job=$(timeout 120 "$BIN" submit "$OUT/job.yaml" --controller "$ADDR" \
  --output-dir "$OUT/fused-shard" "${FUSED[@]}" --set placement.expert_sampling=shard \
  --wait 2>"$OUT/submit-fused.log") ||
  fail "fused shard-sampling job failed: $(tail -3 "$OUT/submit-fused.log")"
echo "ok   fused, sampling from the shards in lockstep across two worker processes"
"$BIN" status --controller "$ADDR" --job "$fused_job" >"$OUT/status-fused.txt" 2>&1 ||
  fail "status of $fused_job: $(tail -3 "$OUT/status-fused.txt")"
grep -E "MoE experts: 2 cards per expert group; .*sampling all-to-all [0-9.]+ MiB" \
  "$OUT/status-fused.txt" >/dev/null ||
  fail "status does not show the sampling exchanges: $(grep 'MoE experts' "$OUT/status-fused.txt")"
echo "ok   fusionrl status shows the rollout's exchanges"

python3 - "$OUT" <<'PY' || fail "expert parallelism across processes"
import os, sys
out = sys.argv[1]
sys.path.insert(0, out)
import checks
from checks import check
ref = checks.rows(os.path.join(out, "ref", "metrics.jsonl"))
cl = checks.rows(os.path.join(out, "cluster", "metrics.jsonl"))
check(all(r.get("expert_parallel") == 2 for r in cl) and len(cl) == 4,
      f"4 steps, each with expert_parallel 2 ({[r.get('expert_parallel') for r in cl]})")
check(all(r.get("expert_alltoall_bytes", 0) > 0 for r in cl),
      "tokens crossed to the other process's experts every step "
      f"({[r.get('expert_alltoall_bytes') for r in cl]} bytes)")
# What the layout itself changes: two nodes instead of one, the data-parallel
# sum's trip between them, and the bookkeeping of the card's memory (32
# bytes of its activations' count). Every learning figure must be equal.
layout = ("nodes", "cross_node_bytes", "cross_node_rounds", "controller_tensor_bytes")
diffs = [d for d in checks.record_diffs(ref, cl)
         if d[1] not in layout and not d[1].startswith("card_memory_")]
check(not diffs, f"every step record equals the one-process run's but for timings and layout ({len(diffs)} differences)")
for d in diffs[:8]:
    print(f"     step {d[0]} {d[1]}: one process {d[2]!r}, two {d[3]!r}")
res = checks.rows(os.path.join(out, "resume", "metrics.jsonl"))
# The memory book is the card's, not the run's: a resumed card's peaks
# start again, and its activations' count differs by a few KB.
rdiffs = [d for d in checks.record_diffs([r for r in cl if r["step"] > 2], [r for r in res if r["step"] > 2])
          if not d[1].startswith("card_memory_")]
check(not rdiffs, f"the resumed steps 3-4 equal the uninterrupted run's ({len(rdiffs)} differences)")
final = lambda run, f: os.path.join(out, run, "checkpoints", "final", f)
for run in ("cluster", "resume"):
    check(checks.same_bytes(final("ref", "model.pt"), final(run, "model.pt")),
          f"{run}: final model.pt (every expert, gathered) is byte-identical to the one-process run's")
    for f in ("optim.pt", "optim.expert-shard-1.pt"):
        check(checks.optimizer_entries(final("ref", f)) == checks.optimizer_entries(final(run, f)),
              f"{run}: {f} holds the one-process run's tensors")
fref = checks.rows(os.path.join(out, "fused-ref", "metrics.jsonl"))
fsh = checks.rows(os.path.join(out, "fused-shard", "metrics.jsonl"))
# Sampling from the shards adds its exchanges' counts and moves the card's
# memory; nothing it samples or learns may differ.
fdiffs = [d for d in checks.record_diffs(fref, fsh)
          if d[1] not in layout and not d[1].startswith("card_memory_")
          and not d[1].startswith("expert_sampling_alltoall_")]
check(len(fsh) == 4 and not fdiffs,
      f"fused, shard sampling across processes: every step record (samples, losses, the final evaluation) equals the gathered in-process run's ({len(fdiffs)} differences)")
for d in fdiffs[:8]:
    print(f"     step {d[0]} {d[1]}: gathered {d[2]!r}, shard {d[3]!r}")
# No card holds the whole model: model.pt holds the dense parameters and
# shard 0's experts, model.expert-shard-1.pt shard 1's; together they are
# the gathered run's model.pt, tensor for tensor.
split = sorted(checks.optimizer_entries(final("fused-shard", "model.pt")) +
               checks.optimizer_entries(final("fused-shard", "model.expert-shard-1.pt")))
check(split == checks.optimizer_entries(final("fused-ref", "model.pt")),
      "fused, shard sampling: model.pt and model.expert-shard-1.pt hold the gathered run's model.pt tensors")
checks.finish()
PY

# 4. A worker killed mid-job: its experts are on no other card, so the job
#    fails, at once and saying why, rather than hanging or going on.
job=$(timeout 60 "$BIN" submit "$OUT/job.yaml" --controller "$ADDR" --output-dir "$OUT/killed" \
      --set run.total_steps=400 --set run.checkpoint_every=0 2>"$OUT/submit-killed.log")
wait_steps "$OUT/killed/metrics.jsonl" 3 60 "$job"
kill_hard "${WORKER_PIDS[1]}"
killed_at=$SECONDS
wait_job "$ADDR" "$job" "$OUT/status-killed.json" 60
python3 - "$OUT" "$((SECONDS - killed_at))" <<'PY' || fail "a lost member of an expert group"
import json, os, sys
out, took = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, out)
import checks
from checks import check
st = json.load(open(os.path.join(out, "status-killed.json")))
msg = st.get("message", "")
print(f"     message: {msg}")
check(st["phase"] == "JOB_PHASE_FAILED", f"the job failed ({st['phase']})")
check("expert group spans worker processes" in msg and "--resume" in msg,
      "the message names the expert group spanning worker processes and --resume")
check(took <= 30, f"it failed within 30 s of the kill ({took} s; the collective timeout is the bound)")
checks.finish()
PY
echo "cluster_expert_parallel_test: ok"

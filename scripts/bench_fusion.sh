#!/usr/bin/env bash
# RL Fusion + StaleSync against synchronous RL, side by side: the same job
# (configs/bench.yaml: model, task, seeds, prompt groups) under
# colocated-sync, fused (s = 0) and fused + StaleSync with s = 1, 2, 4
# (decoupled loss), interleaved, REPEATS times. Prints JSON: every run's
# tokens/s, final eval accuracy and max staleness; per mode the medians and
# the ratio to colocated-sync.
# Usage: scripts/bench_fusion.sh [CONFIG] [STEPS] [REPEATS] [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FUSIONRL_BIN:-build/src/cli/fusionrl}
CFG=${1:-configs/bench.yaml}
STEPS=${2:-40}
REPEATS=${3:-3}
OUT=${4:-runs/bench-fusion}
rm -rf "$OUT"
mkdir -p "$OUT"
"$BIN" sft "$CFG" -o "$OUT/sft" --set init_checkpoint= >/dev/null 2>"$OUT/sft.log"
declare -A MODES=(
  [colocated-sync]="--set placement.mode=colocated-sync"
  [fused]="--set placement.mode=fused"
  [fused+stalesync:1]="--set placement.mode=fused --set stalesync.max_policy_lag=1 --set algorithm.decoupled_loss=true"
  [fused+stalesync:2]="--set placement.mode=fused --set stalesync.max_policy_lag=2 --set algorithm.decoupled_loss=true"
  [fused+stalesync:4]="--set placement.mode=fused --set stalesync.max_policy_lag=4 --set algorithm.decoupled_loss=true"
  [fused+stalesync:2/train2]="--set placement.mode=fused --set stalesync.max_policy_lag=2 --set algorithm.decoupled_loss=true --set placement.fused_train_threads=2 --set placement.fused_rollout_threads=1"
)
ORDER=(colocated-sync fused fused+stalesync:1 fused+stalesync:2 fused+stalesync:4 fused+stalesync:2/train2)
# Idle OpenMP workers sleep instead of spinning, for every mode: with two
# roles sharing a card's cores, spinning workers of one role steal the
# other's cycles (libgomp reads this at load time, so it is set here).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
for r in $(seq "$REPEATS"); do
  for m in "${ORDER[@]}"; do
    # shellcheck disable=SC2086
    "$BIN" run "$CFG" -o "$OUT/${m//\//_}-$r" --init-checkpoint "$OUT/sft/checkpoints/final" \
      --set run.total_steps="$STEPS" --set run.eval_every=0 ${MODES[$m]} \
      >/dev/null 2>"$OUT/${m//\//_}-$r.log"
  done
done
python3 - "$OUT" "$REPEATS" "${ORDER[@]}" <<'PY'
import json, statistics, sys
out, repeats, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
result = {"config": out, "modes": {}}
for m in modes:
    runs = []
    for r in range(1, repeats + 1):
        d = f"{out}/{m.replace('/', '_')}-{r}"
        s = json.load(open(f"{d}/summary.json"))
        rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
        runs.append({"tokens_per_second": s["tokens_per_second"],
                     "final_eval_accuracy": s["final_eval_accuracy"],
                     "max_staleness": max(x["max_staleness"] for x in rows)})
    result["modes"][m] = {
        "runs": runs,
        "median_tokens_per_second": statistics.median(x["tokens_per_second"] for x in runs),
        "median_final_eval_accuracy": statistics.median(x["final_eval_accuracy"] for x in runs),
        "max_staleness": max(x["max_staleness"] for x in runs)}
base = result["modes"]["colocated-sync"]["median_tokens_per_second"]
for m in result["modes"].values():
    m["ratio_to_colocated_sync"] = round(m["median_tokens_per_second"] / base, 3)
print(json.dumps(result, indent=1))
PY

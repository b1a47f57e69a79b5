#!/usr/bin/env bash
# MoE routing side by side on configs/moe.yaml (docs/BENCHMARKS.md "MoE:
# MoGE and router replay"): plain top-k against MoGE grouped routing
# (on-policy, dropless), then RL Fusion with lag 2 and capacity drops with
# and without router replay. Each routing gets its own SFT warm start (the
# routing is part of the function a checkpoint holds). Prints the held-out
# accuracy before and after RL, the mean routing disagreement and dropped
# share, and the wall time.
# Usage: scripts/moe-learning.sh [OUT] [SEED] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/moe-learning}
SEED=${2:-1}
STEPS=${3:-100}
FUSIONRL=${FUSIONRL_BUILD_DIR:-build}/src/cli/fusionrl
mkdir -p "$OUT"
sft() {  # name, then --set overrides
  local name=$1
  shift
  local args=()
  for kv in "$@"; do args+=(--set "$kv"); done
  if [ ! -f "$OUT/sft-$name/checkpoints/final/meta.json" ]; then
    "$FUSIONRL" sft configs/moe.yaml --output-dir "$OUT/sft-$name" \
      --set init_checkpoint= --set seed="$SEED" "${args[@]}" >/dev/null 2>&1
  fi
}
run() {  # name, sft name, then --set overrides
  local name=$1 base=$2
  shift 2
  local args=()
  for kv in "$@"; do args+=(--set "$kv"); done
  local start=$SECONDS
  local summary
  summary=$("$FUSIONRL" run configs/moe.yaml --output-dir "$OUT/$name" \
            --init-checkpoint "$OUT/sft-$base/checkpoints/final" \
            --set seed="$SEED" --set run.total_steps="$STEPS" \
            "${args[@]}" 2>"$OUT/$name.log")
  python3 - "$summary" "$OUT/$name/metrics.jsonl" "$name" \
    $((SECONDS - start)) <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
def mean(k):
    v = [r[k] for r in rows if k in r]
    return sum(v) / len(v) if v else float("nan")
print(f"{sys.argv[3]:22s} {s['initial_eval_accuracy']:.3f} -> "
      f"{s['final_eval_accuracy']:.3f}  disagreement "
      f"{mean('moe_route_disagreement'):.3f}  dropped "
      f"{mean('moe_dropped_frac'):.3f}  logp_diff_max "
      f"{mean('logp_diff_max'):.3f}  ({sys.argv[4]} s)")
PY
}
on_policy=(placement.mode=colocated-sync stalesync.max_policy_lag=0
           model.moe_capacity_factor=0)
sft topk
sft moge model.moe_groups=2
run topk topk "${on_policy[@]}"
run moge moge "${on_policy[@]}" model.moe_groups=2
run fused-lag2-cf1 topk
run fused-lag2-cf1-replay topk algorithm.router_replay=true

#!/usr/bin/env bash
# LoRA against full fine-tuning on the quickstart policy (docs/BENCHMARKS.md
# "LoRA"): one SFT warm start, then the quickstart's RL run with full
# fine-tuning and with LoRA at several ranks and learning rates; prints the
# held-out accuracy before and after each.
# Usage: scripts/lora-learning.sh [OUT] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/lora-learning}
SEED=${2:-1}
FUSIONRL=${FUSIONRL_BUILD_DIR:-build}/src/cli/fusionrl
mkdir -p "$OUT"
if [ ! -f "$OUT/sft/checkpoints/final/meta.json" ]; then
  "$FUSIONRL" sft configs/quickstart.yaml --output-dir "$OUT/sft" \
    --set init_checkpoint= --set seed="$SEED" >/dev/null
fi
run() {  # name, then --set overrides
  local name=$1
  shift
  local args=()
  for kv in "$@"; do args+=(--set "$kv"); done
  local start=$SECONDS
  local summary
  summary=$("$FUSIONRL" run configs/quickstart.yaml --output-dir "$OUT/$name" \
            --init-checkpoint "$OUT/sft/checkpoints/final" --set seed="$SEED" \
            "${args[@]}" 2>"$OUT/$name.log")
  python3 - "$summary" "$name" $((SECONDS - start)) <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:24s} {s['initial_eval_accuracy']:.3f} -> "
      f"{s['final_eval_accuracy']:.3f}  ({sys.argv[3]} s)")
PY
}
# Quickstart's own learning rate for full fine-tuning; LoRA at 10x it (the
# usual LoRA rule) and at 1x, at ranks 8 and 32 with alpha 16 (scale alpha/r)
# and at rank 32 with alpha 64 (the scale of rank 8's run).
run full optim.lr=2e-4
run lora-r8-lr2e-3 model.lora.rank=8 model.lora.alpha=16 optim.lr=2e-3
run lora-r32-a16-lr2e-3 model.lora.rank=32 model.lora.alpha=16 optim.lr=2e-3
run lora-r32-lr2e-3 model.lora.rank=32 model.lora.alpha=64 optim.lr=2e-3
run lora-r8-lr2e-4 model.lora.rank=8 model.lora.alpha=16 optim.lr=2e-4

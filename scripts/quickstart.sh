#!/usr/bin/env bash
# The quickstart: installs dependencies, builds FusionRL, trains a small
# policy's format with a short supervised warm start, then improves it with
# RL (GRPO) and prints the path of the run's summary.json.
# Usage: scripts/quickstart.sh [OUTPUT_DIR]   (default runs/quickstart)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/quickstart}
./scripts/install-deps.sh
./scripts/build.sh
FUSIONRL=${FUSIONRL_BUILD_DIR:-build}/src/cli/fusionrl

# 1. Supervised warm start (skipped when its checkpoint already exists).
if [ ! -f "$OUT/sft/checkpoints/final/meta.json" ]; then
  "$FUSIONRL" sft configs/quickstart.yaml --output-dir "$OUT/sft" --set init_checkpoint= >/dev/null
fi
# 2. RL from the warm start.
summary=$("$FUSIONRL" run configs/quickstart.yaml --output-dir "$OUT" \
          --init-checkpoint "$OUT/sft/checkpoints/final")
python3 - "$summary" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"quickstart: eval accuracy {s['initial_eval_accuracy']:.3f} -> "
      f"{s['final_eval_accuracy']:.3f} after {s['steps']} RL steps, "
      f"{s['tokens_per_second']:.0f} tokens/s, {s['wall_seconds']:.0f}s", file=sys.stderr)
PY
echo "$summary"

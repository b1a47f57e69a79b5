#!/usr/bin/env bash
# Multi-turn RL with a tool (configs/agent-calc.yaml, docs/agents.md):
# supervised warm start on demonstrated calculator episodes, GRPO from it,
# then the final policy evaluated with the tool withheld (env no_tools).
# Prints one JSON line with the figures.
# Usage: scripts/agent-calc.sh [OUTPUT_DIR] [extra --set overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/agent-calc}
shift || true
SETS=()
for s in "$@"; do SETS+=(--set "$s"); done
./scripts/install-deps.sh
./scripts/build.sh
FUSIONRL=${FUSIONRL_BUILD_DIR:-build}/src/cli/fusionrl

# 1. Supervised warm start on demonstrated episodes.
if [ ! -f "$OUT/sft/checkpoints/final/meta.json" ]; then
  "$FUSIONRL" sft configs/agent-calc.yaml --output-dir "$OUT/sft" \
    --set init_checkpoint= "${SETS[@]}" >/dev/null
fi
# 2. GRPO on episodes against the calculator environment.
summary=$("$FUSIONRL" run configs/agent-calc.yaml --output-dir "$OUT" \
          --init-checkpoint "$OUT/sft/checkpoints/final" "${SETS[@]}")
# 3. The same final policy with the environment withheld.
withheld=$("$FUSIONRL" eval configs/agent-calc.yaml \
           --checkpoint "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["checkpoint_dir"])' "$summary")" \
           --set env.name=no_tools "${SETS[@]}")
python3 - "$summary" "$withheld" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
w = {"accuracy": float(sys.argv[2].split()[-1])}  # "eval_accuracy X"
out = {"initial_eval_accuracy": s["initial_eval_accuracy"],
       "final_eval_accuracy": s["final_eval_accuracy"],
       "final_without_tool": w["accuracy"],
       "steps": s["steps"], "wall_seconds": s["wall_seconds"]}
print(f"agent-calc: held-out success {out['initial_eval_accuracy']:.3f} -> "
      f"{out['final_eval_accuracy']:.3f} after {s['steps']} GRPO steps "
      f"({s['wall_seconds']:.0f}s); without the tool {w['accuracy']:.3f}",
      file=sys.stderr)
print(json.dumps(out))
PY

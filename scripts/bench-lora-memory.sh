#!/usr/bin/env bash
# Full fine-tuning against LoRA rank 8 and 32 on a Qwen2.5-0.5B-shaped model
# (scripts/make_hf_fixtures.py --preset qwen2.5-0.5b: random bf16 weights,
# loaded as float32): peak RSS of the whole process, seconds a training step,
# and the bytes a weight publish moves (docs/BENCHMARKS.md "LoRA").
# Each configuration is one fresh process running 2 GRPO steps (math task,
# 2 prompts x 4 samples, 32 new tokens, colocated-sync, no reference model).
# Usage: scripts/bench-lora-memory.sh [OUT] [MODEL_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/bench-lora-memory}
MODEL=${2:-/tmp/q05b}
FUSIONRL=$(realpath "${FUSIONRL_BUILD_DIR:-build}/src/cli/fusionrl")
TOK=${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}/qwen3-tokenizer
mkdir -p "$OUT"
if [ ! -f "$MODEL/config.json" ]; then
  ./scripts/fetch-test-data.sh
  /usr/bin/python3 scripts/make_hf_fixtures.py --preset qwen2.5-0.5b \
    --tokenizer-dir "$TOK" --out "$MODEL"
fi
cat > "$OUT/job.yaml" <<YAML
name: lora-0.5b
seed: 1
num_threads: 2
model:
  hf_path: $MODEL
  max_seq_len: 256
task:
  name: math
  train_path: tests/data/math_sample.jsonl
  eval_size: 2
rollout:
  prompts_per_step: 2
  group_size: 4
  max_new_tokens: 32
  temperature: 1.0
algorithm:
  kl_coef: 0.0
optim:
  micro_batch_size: 4
run:
  total_steps: 2
  eval_every: 0
YAML
echo "config            peak_rss_gb  train_s(step1,step2)  step_s(step2)  publish_mib"
for cfg in "full" "r8:8:16" "r32:32:64"; do
  IFS=: read -r name rank alpha <<<"$cfg"
  sets=()
  if [ -n "${rank:-}" ]; then
    sets=(--set model.lora.rank="$rank" --set model.lora.alpha="$alpha")
  fi
  /usr/bin/time -v "$FUSIONRL" run "$OUT/job.yaml" --output-dir "$OUT/$name" \
    "${sets[@]}" >"$OUT/$name.out" 2>"$OUT/$name.log"
  /usr/bin/python3 - "$OUT/$name" "$name" <<'PY'
import json, re, sys
out, name = sys.argv[1], sys.argv[2]
log = open(out + ".log").read()
rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1))
recs = [json.loads(l) for l in open(out + "/metrics.jsonl")]
m = re.search(r"policy (\d+) parameters", log)
n = int(recs[-1].get("lora_trainable_parameters", 0)) or int(m.group(1))
train = ", ".join(f"{r['train_seconds']:.1f}" for r in recs)
print(f"{name:17s} {rss_kb / 1e6:11.2f}  {train:20s}  "
      f"{recs[-1]['step_seconds']:13.1f}  {4 * n / 2**20:11.1f}")
PY
done

#!/usr/bin/env bash
# The Hugging Face path through the fusionrl binary, as a user drives it: an
# RL job on an imported Qwen3 model (real tokenizer, ChatML prompts, the math
# task), its export, generation from the export and from the checkpoint, the
# same with LoRA (PEFT adapter out and in, --merge, generate --lora), a
# Qwen3-MoE model trained with its experts split over two cards and exported
# whole, and the config errors of model.hf_path and model.lora.
# Usage: hf_e2e_test.sh FUSIONRL_BINARY WORK_DIR FIXTURES_DIR
set -euo pipefail
BIN=$1
WORK=$2
FIX=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MODEL="$FIX/qwen3-tiny"
if [ ! -f "$MODEL/config.json" ]; then
  echo "hf_e2e_test: SKIP: no fixture at $MODEL (needs scripts/fetch-test-data.sh and python3-torch)"
  exit 77  # ctest: Skipped (SKIP_RETURN_CODE), not Passed
fi
rm -rf "$WORK" && mkdir -p "$WORK"
fail() { echo "hf_e2e_test: FAIL: $*" >&2; exit 1; }

cat > "$WORK/job.yaml" <<YAML
name: hf-e2e
model:
  hf_path: $MODEL
  max_seq_len: 160
task:
  name: math
  train_path: $HERE/data/math_sample.jsonl
  eval_size: 4
rollout:
  prompts_per_step: 2
  group_size: 2
  max_new_tokens: 8
run:
  total_steps: 2
  eval_every: 1
  export_final: true
YAML

# 1. RL on the imported model, exported at the end.
summary=$(timeout 300 "$BIN" run "$WORK/job.yaml" -o "$WORK/run" 2>"$WORK/run.log") ||
  { cat "$WORK/run.log"; fail "run exited $?"; }
[ -f "$summary" ] || fail "no summary.json"
grep -q '"steps": 2' "$summary" || fail "summary: $(cat "$summary")"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [ -f "$WORK/run/hf/$f" ] || fail "export lacks $f"
done
grep -q '"Qwen3ForCausalLM"' "$WORK/run/hf/config.json" || fail "export config.json"
# The job trained at 160 tokens; the model keeps its own context.
grep -q '"max_position_embeddings": 512' "$WORK/run/hf/config.json" ||
  fail "export shrank max_position_embeddings"
# The resolved config keeps the imported architecture.
grep -q 'architecture: Qwen3ForCausalLM' "$WORK/run/config.yaml" || fail "config.yaml lacks the architecture"

# 2. Greedy generation: the export and the final checkpoint agree.
a=$(timeout 120 "$BIN" generate --model "$WORK/run/hf" --prompt "What is 2 + 3?" --chat -n 6 --json)
b=$(timeout 120 "$BIN" generate --model "$WORK/run/checkpoints/final" --prompt "What is 2 + 3?" --chat -n 6 --json)
[ "$a" = "$b" ] || fail "export and checkpoint generate differently: $a vs $b"
echo "$a" | grep -q '"prompt_ids":\[151644,' || fail "chat prompt does not open with <|im_start|>: $a"

# 3. Export of the checkpoint by command, bf16, sharded.
timeout 120 "$BIN" export "$WORK/run/checkpoints/final" --out "$WORK/exp" --dtype bfloat16 --max-shard-mb 10 >/dev/null ||
  fail "export exited $?"
[ -f "$WORK/exp/model.safetensors.index.json" ] || fail "no shard index"
grep -q '"torch_dtype": "bfloat16"' "$WORK/exp/config.json" || fail "export dtype"
grep -q '"max_position_embeddings": 512' "$WORK/exp/config.json" ||
  fail "export of the checkpoint shrank max_position_embeddings"

# 4. LoRA on the imported model: the merged export, the PEFT adapter, and
# generation from each way of putting base and adapter together agree.
timeout 300 "$BIN" run "$WORK/job.yaml" -o "$WORK/lora" --set model.lora.rank=4 \
  --set model.lora.alpha=8 --set optim.lr=1e-2 >/dev/null 2>"$WORK/lora.log" ||
  { cat "$WORK/lora.log"; fail "LoRA run exited $?"; }
grep -q '"lora_rank":4' "$WORK/lora/metrics.jsonl" || fail "no lora_rank in metrics.jsonl"
# Random weights earn no reward here, so RL leaves B at 0: a few SFT steps
# on the task's solutions move the adapters.
timeout 300 "$BIN" sft "$WORK/job.yaml" -o "$WORK/lora" --set model.lora.rank=4 \
  --set model.lora.alpha=8 --set sft.steps=3 --set sft.lr=1e-2 --set sft.warmup_steps=0 --set sft.batch_size=8 --set rollout.max_new_tokens=120 --set model.max_seq_len=256 --set task.eval_size=1 \
  >/dev/null 2>"$WORK/lora-sft.log" || { cat "$WORK/lora-sft.log"; fail "LoRA SFT exited $?"; }
for f in adapter_config.json adapter_model.safetensors; do
  [ -f "$WORK/lora/hf-lora/$f" ] || fail "run.export_final wrote no $f"
done
grep -q '"peft_type": "LORA"' "$WORK/lora/hf-lora/adapter_config.json" || fail "adapter_config.json"
grep -q "\"base_model_name_or_path\": \"$MODEL\"" "$WORK/lora/hf-lora/adapter_config.json" ||
  fail "adapter_config.json does not name the base"
timeout 120 "$BIN" export "$WORK/lora/checkpoints/final" --out "$WORK/lora-exp" >/dev/null ||
  fail "export of the LoRA checkpoint exited $?"
cmp -s "$WORK/lora-exp/adapter_model.safetensors" "$WORK/lora/hf-lora/adapter_model.safetensors" ||
  fail "export of the checkpoint and run.export_final wrote different adapters"
timeout 120 "$BIN" export "$WORK/lora/checkpoints/final" --out "$WORK/lora-merged" --merge >/dev/null ||
  fail "export --merge exited $?"
gen() { timeout 120 "$BIN" generate --prompt "What is 2 + 3?" --chat -n 6 --json "$@"; }
m=$(gen --model "$WORK/lora-merged")
[ "$m" = "$(gen --model "$WORK/lora/hf")" ] || fail "merged exports differ"
[ "$m" = "$(gen --model "$MODEL" --lora "$WORK/lora-exp")" ] || fail "generate --lora differs from the merged export"
[ "$m" = "$(gen --model "$WORK/lora/checkpoints/final")" ] || fail "the LoRA checkpoint generates differently"
[ "$m" != "$(gen --model "$MODEL")" ] || fail "the adapter changed nothing"
# Training continues from the PEFT adapter.
timeout 120 "$BIN" validate "$WORK/job.yaml" --set model.lora_path="$WORK/lora-exp" >/dev/null ||
  fail "model.lora_path is refused"

# 5. Bad input: one line, exit 2.
expect_error() {  # expect_error PATTERN CMD...
  local pattern=$1; shift
  set +e; out=$("$@" 2>&1 >/dev/null); rc=$?; set -e
  [ "$rc" = 2 ] || fail "expected exit 2, got $rc from: $* ($out)"
  grep -q -- "$pattern" <<<"$out" || fail "expected '$pattern' in: $out"
}
expect_error "\-\-set model.d_model=256: is 256 but model.hf_path's config.json gives 64" \
  "$BIN" validate "$WORK/job.yaml" --set model.d_model=256
expect_error "model.hf_path" "$BIN" validate "$WORK/job.yaml" --set model.hf_path="$WORK/nope"
mkdir -p "$WORK/badmodel" && echo '{"architectures": ["GPT2LMHeadModel"]}' > "$WORK/badmodel/config.json"
expect_error "architectures: 'GPT2LMHeadModel' is not supported" \
  "$BIN" validate "$WORK/job.yaml" --set model.hf_path="$WORK/badmodel"
expect_error "neither a Hugging Face model directory" "$BIN" generate --model "$WORK" --prompt x
expect_error "model.lora.targets=qkv_proj: unknown projection 'qkv_proj'" \
  "$BIN" validate "$WORK/job.yaml" --set model.lora.rank=8 --set model.lora.targets=qkv_proj
expect_error "model.lora.rank" "$BIN" validate "$WORK/job.yaml" --set model.lora.rank=-2
expect_error "\-\-merge: .* is not a LoRA checkpoint" \
  "$BIN" export "$WORK/run/checkpoints/final" --out "$WORK/x" --merge
cp -r "$WORK/lora-exp" "$WORK/lora-r2"
sed -i 's/"r": 4/"r": 2/' "$WORK/lora-r2/adapter_config.json"
expect_error "lora_A.weight' has shape \[4, 64\] but the base model with r = 2" \
  "$BIN" generate --model "$MODEL" --lora "$WORK/lora-r2" --prompt x

# 6. A mixture of experts: the imported Qwen3-MoE trains with its experts
# split over two cards (placement.expert_parallel 2), each card sampling
# from its own shard (placement.expert_sampling shard: the checkpoints hold
# each shard's experts in a file of its own); the export gathers every
# expert from those files into one Qwen3MoeForCausalLM directory that
# generates as the final checkpoint (read back from its files) does.
MOE="$FIX/qwen3-moe-tiny"
if [ -f "$MOE/config.json" ]; then
  timeout 300 "$BIN" run "$WORK/job.yaml" -o "$WORK/moe" --set model.hf_path="$MOE" \
    --set placement.cards_per_super_node=2 --set placement.expert_parallel=2 \
    --set placement.expert_sampling=shard \
    >/dev/null 2>"$WORK/moe.log" || { cat "$WORK/moe.log"; fail "MoE run exited $?"; }
  [ -f "$WORK/moe/checkpoints/final/model.expert-shard-1.pt" ] ||
    fail "MoE run sampling from its shards: no model.expert-shard-1.pt in the final checkpoint"
  grep -q '"expert_parallel":2' "$WORK/moe/metrics.jsonl" || fail "MoE run: no expert_parallel 2 in metrics.jsonl"
  grep -q '"Qwen3MoeForCausalLM"' "$WORK/moe/hf/config.json" || fail "MoE export config.json"
  grep -q '"num_experts": 4' "$WORK/moe/hf/config.json" || fail "MoE export lacks num_experts"
  grep -q '"norm_topk_prob": false' "$WORK/moe/hf/config.json" || fail "MoE export: the fixture's unnormalised gates not written back"
  header=$(head -c 65536 "$WORK/moe/hf/model.safetensors" | tr -d '\0')
  for e in 0 1 2 3; do
    # A here-string, not a pipe: grep -q exits at its first match, and
    # under pipefail the writer's SIGPIPE would fail the check.
    grep -q "\"model.layers.1.mlp.experts.$e.down_proj.weight\"" <<<"$header" ||
      fail "MoE export lacks expert $e"
  done
  a=$(timeout 120 "$BIN" generate --model "$WORK/moe/hf" --prompt "What is 2 + 3?" --chat -n 6 --json)
  b=$(timeout 120 "$BIN" generate --model "$WORK/moe/checkpoints/final" --prompt "What is 2 + 3?" --chat -n 6 --json)
  [ "$a" = "$b" ] || fail "MoE export and checkpoint generate differently: $a vs $b"
  expect_error "\\-\\-set model.moe_experts=8: is 8 but model.hf_path's config.json gives 4" \
    "$BIN" validate "$WORK/job.yaml" --set model.hf_path="$MOE" --set model.moe_experts=8
  expect_error "moe_gates=renormalised: is renormalised but model.hf_path's config.json gives probabilities" \
    "$BIN" validate "$WORK/job.yaml" --set model.hf_path="$MOE" --set model.moe_gates=renormalised
else
  echo "hf_e2e_test: no $MOE, MoE block skipped"
fi
echo "hf_e2e_test: ok"

#!/usr/bin/env bash
# Throughput of one RL job under four placements, side by side on this
# machine: 1 card; 2 cards of one super node (c10d); 2 super nodes of one
# card in one process (sums through the in-process controller); 2 worker
# processes under a controller on loopback (sums over gRPC/TCP).
# Runs interleaved, REPEATS times; prints JSON with every run's tokens/s,
# the medians and the ratios to 1 card.
# Usage: scripts/bench_placements.sh [CONFIG] [STEPS] [REPEATS] [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FUSIONRL_BIN:-build/src/cli/fusionrl}
CFG=${1:-configs/quickstart.yaml}
STEPS=${2:-40}
REPEATS=${3:-3}
OUT=${4:-runs/bench-placements}
rm -rf "$OUT"
mkdir -p "$OUT"
"$BIN" sft "$CFG" -o "$OUT/sft" --set init_checkpoint= >/dev/null 2>"$OUT/sft.log"
SFT="$OUT/sft/checkpoints/final"
THREADS=$("$BIN" validate "$CFG" --set init_checkpoint= | sed -n 's/^num_threads: //p')
WORKER_THREADS=$(( THREADS / 2 > 0 ? THREADS / 2 : 1 ))
COMMON=(--set run.total_steps="$STEPS" --set run.eval_every=0)

cluster_run() {  # $1 output dir
  local dir=$1 ctl_out="$1.controller" pids=()
  "$BIN" controller --listen 127.0.0.1:0 >"$ctl_out" 2>"$dir.controller.log" &
  local ctl=$!
  for _ in $(seq 150); do grep -q listening "$ctl_out" 2>/dev/null && break; sleep 0.2; done
  local addr
  addr=$(sed -n 's/^listening on //p' "$ctl_out")
  # Two workers share this machine: each gets half of the job's threads.
  "$BIN" worker --controller "$addr" --super-node a --threads "$WORKER_THREADS" \
    2>"$dir.worker-a.log" & pids+=($!)
  "$BIN" worker --controller "$addr" --super-node b --threads "$WORKER_THREADS" \
    2>"$dir.worker-b.log" & pids+=($!)
  "$BIN" submit "$CFG" --controller "$addr" --wait -o "$dir" \
    --set init_checkpoint="\"$SFT\"" --set placement.super_nodes=2 \
    "${COMMON[@]}" >/dev/null 2>"$dir.submit.log"
  kill -TERM "$ctl"; wait "$ctl" || true
  wait "${pids[@]}" || true
}

for r in $(seq "$REPEATS"); do
  "$BIN" run "$CFG" -o "$OUT/card1-$r" --init-checkpoint "$SFT" "${COMMON[@]}" \
    >/dev/null 2>"$OUT/card1-$r.log"
  "$BIN" run "$CFG" -o "$OUT/cards2-$r" --init-checkpoint "$SFT" "${COMMON[@]}" \
    --set placement.cards_per_super_node=2 >/dev/null 2>"$OUT/cards2-$r.log"
  "$BIN" run "$CFG" -o "$OUT/nodes2-$r" --init-checkpoint "$SFT" "${COMMON[@]}" \
    --set placement.super_nodes=2 >/dev/null 2>"$OUT/nodes2-$r.log"
  cluster_run "$OUT/procs2-$r"
done

python3 - "$OUT" "$REPEATS" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
modes = {"card1": "1 card", "cards2": "1 super node x 2 cards (c10d)",
         "nodes2": "2 super nodes x 1 card, one process",
         "procs2": "2 worker processes + controller (loopback gRPC)"}
result = {"modes": {}}
for key, label in modes.items():
    runs = [json.load(open(f"{out}/{key}-{r}/summary.json")) for r in range(1, repeats + 1)]
    tps = [s["tokens_per_second"] for s in runs]
    result["modes"][key] = {"label": label, "tokens_per_second": tps,
                            "median": statistics.median(tps),
                            "final_eval_accuracy": [s["final_eval_accuracy"] for s in runs]}
base = result["modes"]["card1"]["median"]
for m in result["modes"].values():
    m["ratio_to_1_card"] = round(m["median"] / base, 3)
print(json.dumps(result, indent=1))
PY

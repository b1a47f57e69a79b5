#!/usr/bin/env bash
# Validates `fusionrl simulate` against real runs on this machine
# (docs/simulate.md, "Validation against real runs"): runs CONFIG for real
# on 1 super node (with the threads one super node of the next run gets)
# and on 2 (c10d data plane, twice the prompts: the same work per super
# node, weak scaling as the simulator does), calibrates the simulator on
# the 1-super-node run and predicts both. Writes OUT_DIR/
# validation.json with the measured and predicted mean step times (steps
# 2..N: step 1 is warm-up) and the prediction's error; prints its path.
#
#   scripts/validate-simulate.sh FUSIONRL_BINARY OUT_DIR [CONFIG] [STEPS] [INIT_CHECKPOINT]
#
# CONFIG defaults to configs/quickstart.yaml, STEPS to 25. The figures are
# wall-clock times of a shared machine: compare the two runs of one
# invocation, and repeat it (docs/simulate.md: identical runs here differ
# by up to 15%).
set -euo pipefail
BIN=${1:?usage: validate-simulate.sh FUSIONRL_BINARY OUT_DIR [CONFIG] [STEPS] [INIT_CHECKPOINT]}
OUT=${2:?usage: validate-simulate.sh FUSIONRL_BINARY OUT_DIR [CONFIG] [STEPS] [INIT_CHECKPOINT]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CFG=${3:-$ROOT/configs/quickstart.yaml}
STEPS=${4:-25}
INIT=${5:-}
fail() { echo "validate-simulate: $*" >&2; exit 1; }
[ -x "$BIN" ] || fail "no fusionrl binary at '$BIN'"
[ -f "$CFG" ] || fail "no config at '$CFG'"
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 3 ] || fail "STEPS must be an integer >= 3, got '$STEPS'"
rm -rf "$OUT/sn1" "$OUT/sn2" "$OUT/sim-work"
mkdir -p "$OUT"

init_args=(--set 'init_checkpoint=""')
[ -n "$INIT" ] && init_args=(--init-checkpoint "$INIT")

# The config's prompts per step, group size and threads, as the run sees
# them (validate prints the resolved config, one key a line).
read -r PROMPTS GROUP THREADS < <("$BIN" validate "$CFG" "${init_args[@]}" 2>"$OUT/validate.log" | python3 -c '
import sys
section, got = "", {}
for line in sys.stdin:
    if line[:1].isalpha():
        section = line.split(":")[0]
    key, _, value = line.strip().partition(": ")
    got[(section if line.startswith("  ") else "") + "." + key] = value
print(got["rollout.prompts_per_step"], got["rollout.group_size"], got[".num_threads"])
') || fail "cannot read $CFG: $(tail -3 "$OUT/validate.log")"

common=(--set run.total_steps="$STEPS" --set run.eval_every=0 --set run.checkpoint_every=0)
# The calibration run gets the threads each super node of the 2-super-node
# run gets (the embedded run splits num_threads: max(1, threads / 2)), so
# the costs fed to the simulator are those of the compute each real super
# node has; the simulated super nodes then have dedicated hardware
# (shared_host_threads 0). What the prediction leaves out is what the two
# real super nodes do to each other on one machine, and their timing.
NODE_THREADS=$(( THREADS / 2 > 1 ? THREADS / 2 : 1 ))
"$BIN" run "$CFG" -o "$OUT/sn1" "${init_args[@]}" "${common[@]}" \
  --set num_threads="$NODE_THREADS" \
  >/dev/null 2>"$OUT/sn1.log" || fail "1-super-node run failed: $(tail -3 "$OUT/sn1.log")"
"$BIN" run "$CFG" -o "$OUT/sn2" "${init_args[@]}" "${common[@]}" \
  --set placement.super_nodes=2 --set rollout.prompts_per_step=$((2 * PROMPTS)) \
  --set run.data_plane=c10d \
  >/dev/null 2>"$OUT/sn2.log" || fail "2-super-node run failed: $(tail -3 "$OUT/sn2.log")"

# The gradient bytes one step sends across super nodes, as the real run
# counted them (float32: 4 bytes a parameter).
GRAD_BYTES=$(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(int(max(r.get("cross_node_bytes", 0) for r in rows)))
' "$OUT/sn2/metrics.jsonl")
[ "$GRAD_BYTES" -gt 0 ] || fail "the 2-super-node run reports no cross_node_bytes"

# Loopback bandwidth and latency are assumed (1 GB/s, 50 us): the ring they
# give is well under 1% of a step of the quickstart model.
"$BIN" simulate "$ROOT/configs/simulate.yaml" --calibrate-from "$OUT/sn1" \
  --super-nodes 1,2 --cards-per-super-node 1 --modes colocated-sync \
  --steps "$STEPS" --set rollout.prompts_per_step="$PROMPTS" \
  --set rollout.group_size="$GROUP" \
  --cost shared_host_threads=0 --cost jitter_sigma=0 \
  --cost straggler_super_nodes=0 --cost model_params=$((GRAD_BYTES / 4)) \
  --cost bytes_per_param=4 --cost inter_bandwidth_gbps=1 \
  --cost inter_latency_us=50 --work-dir "$OUT/sim-work" \
  --out "$OUT/simulate.json" >/dev/null 2>"$OUT/simulate.log" ||
  fail "simulate failed: $(tail -3 "$OUT/simulate.log")"

python3 - "$OUT" "$STEPS" <<'PY'
import json, os, statistics, sys
out, steps = sys.argv[1], int(sys.argv[2])
def measured(run):
    rows = [json.loads(l) for l in open(os.path.join(out, run, "metrics.jsonl"))]
    return statistics.mean(r["step_seconds"] for r in rows if r["step"] >= 2)
sim = {r["super_nodes"]: r for r in json.load(open(os.path.join(out, "simulate.json")))["runs"]}
result = {"steps": steps, "super_nodes": []}
for n, run in ((1, "sn1"), (2, "sn2")):
    m, p = measured(run), sim[n]["mean_step_seconds"]
    result["super_nodes"].append({"super_nodes": n, "measured_step_seconds": m,
                                  "predicted_step_seconds": p, "error": p / m - 1})
path = os.path.join(out, "validation.json")
json.dump(result, open(path, "w"), indent=1)
for r in result["super_nodes"]:
    print(f"{r['super_nodes']} super node(s): measured {r['measured_step_seconds']:.3f} s, "
          f"predicted {r['predicted_step_seconds']:.3f} s ({100 * r['error']:+.1f}%)", file=sys.stderr)
print(path)
PY

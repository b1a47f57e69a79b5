#!/usr/bin/env bash
# How a slow environment overlaps with decoding: wall seconds of `fusionrl
# eval` (greedy episodes of configs/agent-calc.yaml's 200 held-out problems)
# through the Python example server answering every Step DELAY ms late, for
# each env.admit_after_steps given (docs/BENCHMARKS.md).
# Usage: scripts/bench-env-latency.sh DELAY_MS ADMIT... (CHECKPOINT in the
# environment, default runs/agent-calc/checkpoints/final)
set -euo pipefail
cd "$(dirname "$0")/.."
CHECKPOINT=${CHECKPOINT:-runs/agent-calc/checkpoints/final}
DELAY=$1; shift
${FUSIONRL_PYTHON:-/usr/bin/python3} examples/env_server/calculator_server.py --port 0 --delay-ms $DELAY --threads 64 > "${TMPDIR:-/tmp}/env-latency-server.out" 2>&1 &
SP=$!
P=
for i in $(seq 100); do P=$(sed -n 's/^listening on //p' "${TMPDIR:-/tmp}/env-latency-server.out"); [ -n "$P" ] && break; sleep 0.1; done
for A in "$@"; do
  t0=$(date +%s.%N)
  acc=$(build/src/cli/fusionrl eval configs/agent-calc.yaml --checkpoint "$CHECKPOINT" --set env.name=remote --set env.address=127.0.0.1:$P --set env.admit_after_steps=$A --set env.max_concurrency=64 2>/dev/null)
  t1=$(date +%s.%N)
  echo "delay ${DELAY}ms admit_after_steps $A: $acc  $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
done
kill $SP

#!/usr/bin/env bash
# scripts/validate-simulate.sh end to end on the tiny test job (6 real steps
# on 1 and on 2 super nodes, then the simulator calibrated on the first):
# validation.json has both measurements and predictions, and the
# 1-super-node prediction reproduces the run it was fitted on (within 2%:
# the fit's residual, not a timing comparison). The 2-super-node error is
# printed, not checked: it is a benchmark figure of a shared machine
# (docs/simulate.md has the measured ones and the noise).
#
#   tests/simulate_validation_test.sh FUSIONRL_BINARY
set -euo pipefail
BIN=${1:?usage: simulate_validation_test.sh FUSIONRL_BINARY}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

path=$("$ROOT/scripts/validate-simulate.sh" "$BIN" "$tmp" "$ROOT/tests/data/tiny.yaml" 6) ||
  fail "validate-simulate.sh exited $?"
[ "$path" = "$tmp/validation.json" ] || fail "stdout: $path"
python3 - "$path" <<'PY' || fail "validation.json checks"
import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["steps"] == 6, d
runs = {r["super_nodes"]: r for r in d["super_nodes"]}
assert sorted(runs) == [1, 2], d
for r in runs.values():
    for k in ("measured_step_seconds", "predicted_step_seconds"):
        assert r[k] > 0 and math.isfinite(r[k]), r
    assert abs(r["error"] - (r["predicted_step_seconds"] / r["measured_step_seconds"] - 1)) < 1e-9, r
assert abs(runs[1]["error"]) < 0.02, ("the fit does not reproduce its own run", runs[1])
print(f"ok   validation.json: 1 super node {100 * runs[1]['error']:+.1f}%, "
      f"2 super nodes {100 * runs[2]['error']:+.1f}% (not checked)")
PY

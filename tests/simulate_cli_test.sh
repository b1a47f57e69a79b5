#!/usr/bin/env bash
# `fusionrl simulate` end to end: configs/simulate.yaml over 1 and 2 super
# nodes, the JSON's fields and values (scaling_efficiency of N = 1 is 1, no
# tensor bytes through the controller), and a bad cost-model key (exit 2,
# the key named).
#
#   tests/simulate_cli_test.sh FUSIONRL_BINARY
set -euo pipefail

BIN=${1:?usage: simulate_cli_test.sh FUSIONRL_BINARY}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. Two runs of colocated-sync, 4 steps, 2 cards per super node.
"$BIN" simulate "$ROOT/configs/simulate.yaml" --super-nodes 1,2 \
  --cards-per-super-node 2 --modes colocated-sync --steps 4 \
  --set rollout.prompts_per_step=8 --work-dir "$tmp/work" \
  --out "$tmp/sim.json" >"$tmp/stdout" 2>"$tmp/stderr" ||
  fail "simulate exited $?: $(tail -5 "$tmp/stderr")"
[ "$(cat "$tmp/stdout")" = "$tmp/sim.json" ] || fail "stdout: $(cat "$tmp/stdout")"
python3 - "$tmp/sim.json" <<'PY' || fail "JSON checks"
import json, sys
d = json.load(open(sys.argv[1]))
runs = d["runs"]
assert [(r["mode"], r["super_nodes"]) for r in runs] == \
    [("colocated-sync", 1), ("colocated-sync", 2)], runs
fields = ["mode", "super_nodes", "cards", "tokens_per_second",
          "scaling_efficiency", "card_busy_fraction", "max_staleness",
          "max_clock_skew", "controller_messages_per_step",
          "controller_cpu_seconds_per_step",
          "controller_tensor_bytes_per_step"]
for r in runs:
    missing = [f for f in fields if f not in r]
    assert not missing, ("missing", missing)
    assert r["tokens_per_second"] > 0, r
    assert r["controller_tensor_bytes_per_step"] == 0, r
    assert r["steps"] == 4, r
    assert r["max_staleness"] == 0 and r["max_clock_skew"] == 0, r
assert runs[0]["cards"] == 2 and runs[1]["cards"] == 4, runs
assert abs(runs[0]["scaling_efficiency"] - 1) < 1e-12, runs[0]
assert 0 < runs[1]["scaling_efficiency"] < 1, runs[1]
assert d["cost_model"]["inter_bandwidth_gbps"] == 50, d["cost_model"]
PY
# The simulated jobs' outputs are gone (no --keep).
[ -z "$(ls -A "$tmp/work")" ] || fail "work dir not cleaned: $(ls "$tmp/work")"

# 2. A bad cost-model key: exit 2, the key named.
sed 's/^  jitter_sigma:/  jiter_sigma:/' "$ROOT/configs/simulate.yaml" >"$tmp/bad.yaml"
set +e
"$BIN" simulate "$tmp/bad.yaml" --out "$tmp/bad.json" >/dev/null 2>"$tmp/err"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "bad key exited $rc, want 2"
grep -q "cost_model.jiter_sigma: unknown key" "$tmp/err" ||
  fail "error does not name the key: $(cat "$tmp/err")"
[ ! -e "$tmp/bad.json" ] || fail "wrote output despite the error"

echo "PASS"

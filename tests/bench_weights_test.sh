#!/usr/bin/env bash
# `fusionrl bench-weights` end to end on a small payload: the JSON has every
# path with positive, finite seconds and consistent bytes/s and ratios (the
# bytes themselves are compared inside the benchmark: a receiver holding
# other bytes fails it), and a bad --sizes-mib is a clear error (exit 2).
#
#   tests/bench_weights_test.sh FUSIONRL_BINARY
set -euo pipefail

BIN=${1:?usage: bench_weights_test.sh FUSIONRL_BINARY}
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$BIN" bench-weights --sizes-mib 1,3 --ranks 3 --repeats 2 --out "$tmp/w.json" \
  >"$tmp/stdout" 2>"$tmp/stderr" || fail "bench-weights exited $?: $(tail -5 "$tmp/stderr")"
[ "$(cat "$tmp/stdout")" = "$tmp/w.json" ] || fail "stdout: $(cat "$tmp/stdout")"
python3 - "$tmp/w.json" <<'PY' || fail "JSON checks"
import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 3 and d["repeats"] == 2, d
assert [s["mib"] for s in d["sizes"]] == [1, 3], d["sizes"]
paths = ["memcpy", "gloo_broadcast", "weight_service_publish",
         "weight_service_fetch", "weight_service_sync", "crc32c_tables", "crc32c"]
assert isinstance(d["crc32c_instruction"], bool), d
for s in d["sizes"]:
    n = s["mib"] << 20
    for p in paths:
        r = s[p]
        assert len(r["seconds"]) == 2 and all(t > 0 and math.isfinite(t) for t in r["seconds"]), (p, r)
        assert abs(r["bytes_per_second"] * r["median_seconds"] - n) < 1e-6 * n, (p, r)
        want = r["bytes_per_second"] / s["memcpy"]["bytes_per_second"]
        assert abs(r["ratio_to_memcpy"] - want) < 1e-9 * want, (p, r)
    sync = s["weight_service_sync"]["seconds"]
    parts = zip(s["weight_service_publish"]["seconds"], s["weight_service_fetch"]["seconds"])
    assert all(abs(a + b - t) < 1e-9 for (a, b), t in zip(parts, sync)), s
print("ok   bench-weights JSON")
PY

rc=0
"$BIN" bench-weights --sizes-mib 4,x >/dev/null 2>"$tmp/bad" || rc=$?
[ "$rc" -eq 2 ] || fail "bad --sizes-mib: exit $rc, want 2"
grep -q "sizes-mib: 'x'" "$tmp/bad" || fail "bad --sizes-mib message: $(cat "$tmp/bad")"
echo "ok   bad --sizes-mib: exit 2, $(head -1 "$tmp/bad")"

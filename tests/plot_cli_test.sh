#!/usr/bin/env bash
# `fusionrl plot` end to end on fixtures written here: a run directory
# (metrics.jsonl, summary.json, config.yaml) and a `fusionrl bench` JSON
# become self-contained HTML reports with one <svg> per expected chart, the
# right number of points per line and no network reference; a run still
# being written (no summary, half a last line) still plots; the error cases
# (missing path, a directory without metrics.jsonl, a malformed line, a JSON
# no benchmark wrote, an unwritable --out) are one line on stderr with exit
# 2 (bad input) or 1 (cannot write). With chromium on PATH, the run report
# is also rendered to OUT_DIR/plot.png (and the bench one to
# OUT_DIR/plot-bench.png) for a person to look at.
#
#   tests/plot_cli_test.sh FUSIONRL_BINARY OUT_DIR
set -euo pipefail

BIN=${1:?usage: plot_cli_test.sh FUSIONRL_BINARY OUT_DIR}
OUT=${2:?usage: plot_cli_test.sh FUSIONRL_BINARY OUT_DIR}
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/run" "$OUT/running" "$OUT/empty-dir" "$OUT/bench" "$OUT"/*.err
mkdir -p "$OUT/run" "$OUT/empty-dir" "$OUT/bench"

# 1. A finished fused run with max_policy_lag 1: 5 steps, evals after steps
#    3 and 5, an initial eval in summary.json, no memory fields.
cat >"$OUT/run/metrics.jsonl" <<'EOF'
{"step":1,"policy_version":1,"reward_mean":0.21875,"train_accuracy":0.1875,"response_len_mean":6.1,"finished_frac":0.9,"loss":0.0123,"pg_loss":0.0121,"kl":0,"entropy":4.57,"clip_frac":0,"grad_norm":0.31,"lr":0.00025,"max_staleness":0,"over_stale_samples":0,"rollout_tokens":195,"rollout_seconds":0.0108,"rollout_wait_seconds":0.0111,"train_seconds":0.0334,"step_seconds":0.0445,"cards":1,"nodes":1,"attempt":1,"cross_node_rounds":0,"cross_node_seconds":0,"cross_node_bytes":0,"rollout_gate_wait_seconds":0.0087,"weight_sync_seconds":0,"weight_sync_bytes":0,"staleness_0":32,"staleness_1":0,"tokens_per_second":4382.0}
{"step":2,"policy_version":2,"reward_mean":0.28125,"train_accuracy":0.25,"response_len_mean":6.0,"finished_frac":0.91,"loss":-0.0389,"pg_loss":-0.0390,"kl":8.9e-06,"entropy":4.56,"clip_frac":0,"grad_norm":0.58,"lr":0.0005,"max_staleness":1,"over_stale_samples":0,"rollout_tokens":192,"rollout_seconds":0.0115,"rollout_wait_seconds":4e-06,"train_seconds":0.0338,"step_seconds":0.0338,"cards":1,"nodes":1,"attempt":1,"cross_node_rounds":0,"cross_node_seconds":0,"cross_node_bytes":0,"rollout_gate_wait_seconds":0,"weight_sync_seconds":0,"weight_sync_bytes":0,"staleness_0":0,"staleness_1":32,"tokens_per_second":5680.5}
{"step":3,"policy_version":3,"reward_mean":0.34375,"train_accuracy":0.3125,"response_len_mean":5.9,"finished_frac":0.93,"loss":-0.0211,"pg_loss":-0.0213,"kl":5.9e-05,"entropy":4.55,"clip_frac":0.01,"grad_norm":0.69,"lr":0.00075,"max_staleness":1,"over_stale_samples":0,"rollout_tokens":189,"rollout_seconds":0.0109,"rollout_wait_seconds":3e-06,"train_seconds":0.0299,"step_seconds":0.0300,"cards":1,"nodes":1,"attempt":1,"cross_node_rounds":0,"cross_node_seconds":0,"cross_node_bytes":0,"rollout_gate_wait_seconds":0.0301,"weight_sync_seconds":0,"weight_sync_bytes":0,"staleness_0":0,"staleness_1":32,"eval_accuracy":0.375,"eval_seconds":0.013,"tokens_per_second":6300.0}
{"step":4,"policy_version":4,"reward_mean":0.40625,"train_accuracy":0.375,"response_len_mean":5.8,"finished_frac":0.95,"loss":-0.0102,"pg_loss":-0.0104,"kl":7.1e-05,"entropy":4.53,"clip_frac":0.02,"grad_norm":0.64,"lr":0.001,"max_staleness":1,"over_stale_samples":0,"rollout_tokens":186,"rollout_seconds":0.0112,"rollout_wait_seconds":2e-06,"train_seconds":0.0301,"step_seconds":0.0302,"cards":1,"nodes":1,"attempt":1,"cross_node_rounds":0,"cross_node_seconds":0,"cross_node_bytes":0,"rollout_gate_wait_seconds":0.0188,"weight_sync_seconds":0,"weight_sync_bytes":0,"staleness_0":0,"staleness_1":32,"tokens_per_second":6158.9}
{"step":5,"policy_version":5,"reward_mean":0.46875,"train_accuracy":0.4375,"response_len_mean":5.7,"finished_frac":0.97,"loss":-0.0057,"pg_loss":-0.0059,"kl":8.4e-05,"entropy":4.51,"clip_frac":0.02,"grad_norm":0.60,"lr":0.001,"max_staleness":1,"over_stale_samples":0,"rollout_tokens":183,"rollout_seconds":0.0110,"rollout_wait_seconds":3e-06,"train_seconds":0.0297,"step_seconds":0.0298,"cards":1,"nodes":1,"attempt":1,"cross_node_rounds":0,"cross_node_seconds":0,"cross_node_bytes":0,"rollout_gate_wait_seconds":0.0203,"weight_sync_seconds":0,"weight_sync_bytes":0,"staleness_0":0,"staleness_1":32,"eval_accuracy":0.5,"eval_seconds":0.012,"tokens_per_second":6140.9}
EOF
cat >"$OUT/run/summary.json" <<'EOF'
{
  "kind": "rl",
  "initial_eval_accuracy": 0.25,
  "final_eval_accuracy": 0.5,
  "steps": 5,
  "rollout_tokens": 945,
  "wall_seconds": 0.1683,
  "tokens_per_second": 5615.0,
  "final_train_reward": 0.46875,
  "policy_version": 5,
  "checkpoint_dir": "runs/plot-fixture/checkpoints/final",
  "interrupted": false,
  "resumed_from_step": 0
}
EOF
cat >"$OUT/run/config.yaml" <<'EOF'
name: plot-fixture
seed: 1
device: cpu
run:
  total_steps: 5
  eval_every: 3
placement:
  mode: fused
  super_nodes: 1
  cards_per_super_node: 1
stalesync:
  max_policy_lag: 1
  over_stale: regenerate
EOF

"$BIN" plot "$OUT/run" >"$OUT/stdout" 2>"$OUT/stderr" ||
  fail "plot exited $?: $(tail -5 "$OUT/stderr")"
[ "$(cat "$OUT/stdout")" = "$OUT/run/report.html" ] ||
  fail "stdout: $(cat "$OUT/stdout")"

# Shared checks: self-contained, `svgs` charts, and per data-series the
# number of points of its polyline (or bars of its rects).
cat >"$OUT/check.py" <<'PY'
import json, re, sys
html = open(sys.argv[1]).read()
want = json.loads(sys.argv[2])
svgs = html.count("<svg")
assert svgs == want["svgs"], ("svg count", svgs, want["svgs"])
assert "<script" not in html.lower(), "a script in the report"
urls = re.findall(r"https?://[^\s\"'<>)]*", html)
assert all(u == "http://www.w3.org/2000/svg" for u in urls), ("external", urls)
assert not re.search(r"\b(src|href)=", html), "a linked resource"
lines = {}
for attrs in re.findall(r"<polyline ([^>]*)>", html):
    name = re.search(r'data-series="([^"]*)"', attrs).group(1)
    pts = re.search(r'points="([^"]*)"', attrs).group(1).split()
    assert all(re.fullmatch(r"-?[\d.]+,-?[\d.]+", p) for p in pts), pts
    lines.setdefault(name, []).append(len(pts))
for name, counts in want.get("lines", {}).items():
    assert lines.get(name) == counts, ("points of", name, lines.get(name), counts)
for name in want.get("no_lines", []):
    assert name not in lines, ("drawn", name)
bars = {}
for name in re.findall(r'<rect data-series="([^"]*)"', html):
    bars[name] = bars.get(name, 0) + 1
for name, n in want.get("bars", {}).items():
    assert bars.get(name) == n, ("bars of", name, bars.get(name), n)
dots = html.count('class="repeat"')
assert dots == want.get("dots", 0), ("repeat dots", dots)
for text in want.get("texts", []):
    assert text in html, ("missing text", text)
print("ok  ", sys.argv[1])
PY
# Reward, accuracy, throughput, loss, staleness histogram, max staleness,
# step-time split: 7 charts (no memory fields, so no memory chart).
python3 "$OUT/check.py" "$OUT/run/report.html" '{
  "svgs": 7,
  "lines": {"reward_mean": [5], "train_accuracy": [5], "eval_accuracy": [3],
            "tokens_per_second": [5], "loss": [5], "max_staleness": [5],
            "train_seconds": [5], "rollout_seconds": [5],
            "rollout_wait_seconds": [5], "rollout_gate_wait_seconds": [5]},
  "no_lines": ["weight_sync_seconds", "cross_node_seconds", "eval_seconds"],
  "bars": {"samples": 2},
  "texts": ["<h1>plot-fixture</h1>", "0.25 → 0.5", "5615",
            "no memory fields in this run&#39;s records",
            "Zero at every step, not drawn: weight_sync_seconds, cross_node_seconds",
            "finished (summary.json written)", "of 5 planned"]
}' || fail "run report checks"

# 2. A run still going: no summary.json, half a last line; --out elsewhere;
#    the metrics.jsonl path stands for its directory.
mkdir -p "$OUT/running"
cp "$OUT/run/config.yaml" "$OUT/running/"
head -3 "$OUT/run/metrics.jsonl" >"$OUT/running/metrics.jsonl"
printf '{"step":4,"policy_version":4,"reward_mean":0.4' >>"$OUT/running/metrics.jsonl"
"$BIN" plot "$OUT/running/metrics.jsonl" --out "$OUT/running.html" \
  >"$OUT/stdout" 2>"$OUT/stderr" || fail "running: exited $?: $(cat "$OUT/stderr")"
[ "$(cat "$OUT/stdout")" = "$OUT/running.html" ] || fail "stdout: $(cat "$OUT/stdout")"
python3 "$OUT/check.py" "$OUT/running.html" '{
  "svgs": 7,
  "lines": {"reward_mean": [3], "eval_accuracy": [1]},
  "texts": ["no summary.json yet", "metrics.jsonl:4: the last line is incomplete",
            "median of the steps", "sum of step_seconds"]
}' || fail "running run checks"

# 3. A `fusionrl bench` JSON: 3 modes x 2 repeats; the first run of two modes
#    has a metrics.jsonl (relative to the JSON's folder), the third none.
mkdir -p "$OUT/bench/runs/colocated-sync-1" "$OUT/bench/runs/fused+stalesync_1-1"
cp "$OUT/run/metrics.jsonl" "$OUT/bench/runs/colocated-sync-1/"
cp "$OUT/run/metrics.jsonl" "$OUT/bench/runs/fused+stalesync_1-1/"
cat >"$OUT/bench/bench.json" <<'EOF'
{
 "config": "configs/bench.yaml",
 "steps": 5,
 "repeats": 2,
 "init_checkpoint": "runs/bench-bench/sft/checkpoints/final",
 "omp_wait_policy": "default",
 "modes": {
  "colocated-sync": {
   "placement": "colocated-sync", "max_policy_lag": 0,
   "median_tokens_per_second": 2338.3, "median_final_eval_accuracy": 0.52,
   "median_trainer_busy_fraction": 0.761, "median_rollout_busy_fraction": 0.238,
   "max_staleness": 0,
   "runs": [
    {"tokens_per_second": 2301.0, "final_eval_accuracy": 0.52, "max_staleness": 0,
     "trainer_busy_fraction": 0.75, "rollout_busy_fraction": 0.24,
     "output_dir": "runs/colocated-sync-1"},
    {"tokens_per_second": 2375.6, "final_eval_accuracy": 0.52, "max_staleness": 0,
     "trainer_busy_fraction": 0.772, "rollout_busy_fraction": 0.236,
     "output_dir": "runs/colocated-sync-2"}],
   "ratio_to_colocated_sync": 1.0},
  "disaggregated": {
   "placement": "disaggregated", "max_policy_lag": 0,
   "median_tokens_per_second": 2547.8, "median_final_eval_accuracy": 0.5,
   "median_trainer_busy_fraction": 0.969, "median_rollout_busy_fraction": 0.362,
   "max_staleness": 0,
   "runs": [
    {"tokens_per_second": 2520.1, "final_eval_accuracy": 0.5, "max_staleness": 0,
     "trainer_busy_fraction": 0.96, "rollout_busy_fraction": 0.36,
     "output_dir": "runs/disaggregated-1"},
    {"tokens_per_second": 2575.5, "final_eval_accuracy": 0.5, "max_staleness": 0,
     "trainer_busy_fraction": 0.978, "rollout_busy_fraction": 0.364,
     "output_dir": "runs/disaggregated-2"}],
   "ratio_to_colocated_sync": 1.0896},
  "fused+stalesync:1": {
   "placement": "fused", "max_policy_lag": 1,
   "median_tokens_per_second": 2855.7, "median_final_eval_accuracy": 0.52,
   "median_trainer_busy_fraction": 0.965, "median_rollout_busy_fraction": 0.345,
   "max_staleness": 1,
   "runs": [
    {"tokens_per_second": 2840.0, "final_eval_accuracy": 0.52, "max_staleness": 1,
     "trainer_busy_fraction": 0.96, "rollout_busy_fraction": 0.34,
     "output_dir": "runs/fused+stalesync_1-1"},
    {"tokens_per_second": 2871.4, "final_eval_accuracy": 0.52, "max_staleness": 1,
     "trainer_busy_fraction": 0.97, "rollout_busy_fraction": 0.35,
     "output_dir": "runs/fused+stalesync_1-2"}],
   "ratio_to_colocated_sync": 1.2213}
 }
}
EOF
"$BIN" plot "$OUT/bench/bench.json" >"$OUT/stdout" 2>"$OUT/stderr" ||
  fail "bench: exited $?: $(cat "$OUT/stderr")"
[ "$(cat "$OUT/stdout")" = "$OUT/bench/bench.html" ] || fail "stdout: $(cat "$OUT/stdout")"
# 4 bar charts (tokens/s, ratio, busy, eval accuracy) + 4 per-step charts of
# the 2 modes with metrics; dots: 3 modes x 2 repeats on tokens/s, trainer
# busy, rollout busy and accuracy.
python3 "$OUT/check.py" "$OUT/bench/bench.html" '{
  "svgs": 8,
  "lines": {"colocated-sync": [5, 5, 5, 5], "fused+stalesync:1": [5, 5, 5, 5]},
  "no_lines": ["disaggregated"],
  "bars": {"median": 6, "ratio": 3, "trainer (train_seconds)": 3,
           "rollout (rollout_seconds)": 3},
  "dots": 24,
  "texts": ["<td>fused+stalesync:1</td>", "1.22x", "2301, 2376",
            "Per-step curves of 1 mode(s) are missing"]
}' || fail "bench report checks"

# 4. Errors: one line on stderr, exit 2 for bad input, 1 for an unwritable
#    --out; no report written.
expect_error() {  # expect_error RC PATTERN NAME -- ARGS...
  local want_rc=$1 pattern=$2 name=$3
  shift 4
  set +e
  "$BIN" plot "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  local rc=$?
  set -e
  [ "$rc" -eq "$want_rc" ] || fail "$name: exit $rc, want $want_rc: $(cat "$OUT/$name.err")"
  [ "$(wc -l <"$OUT/$name.err")" -eq 1 ] || fail "$name: stderr not one line: $(cat "$OUT/$name.err")"
  grep -q "^fusionrl: error: .*$pattern" "$OUT/$name.err" ||
    fail "$name: stderr does not say '$pattern': $(cat "$OUT/$name.err")"
  [ ! -s "$OUT/$name.out" ] || fail "$name: stdout not empty: $(cat "$OUT/$name.out")"
  echo "ok   error: $name: $(cat "$OUT/$name.err")"
}
expect_error 2 "no such file or directory" missing -- "$OUT/no-such-run"
expect_error 2 "has no metrics.jsonl" no-metrics -- "$OUT/empty-dir"
[ ! -e "$OUT/empty-dir/report.html" ] || fail "no-metrics: wrote a report"
mkdir -p "$OUT/bad-line"
{ head -2 "$OUT/run/metrics.jsonl"; echo '{"step":3,"reward_mean":0.3,}'
  tail -2 "$OUT/run/metrics.jsonl"; } >"$OUT/bad-line/metrics.jsonl"
expect_error 2 "bad-line/metrics.jsonl:3: not JSON: " bad-line -- "$OUT/bad-line"
[ ! -e "$OUT/bad-line/report.html" ] || fail "bad-line: wrote a report"
mkdir -p "$OUT/no-step"
echo '{"reward_mean":0.3}' >"$OUT/no-step/metrics.jsonl"
expect_error 2 "no-step/metrics.jsonl:1: the record has no numeric \"step\"" \
  no-step -- "$OUT/no-step"
printf '{\n "modes": {\n  "x": 1,,\n }\n}\n' >"$OUT/bad.json"
expect_error 2 "bad.json:3:10: not JSON: " bad-json -- "$OUT/bad.json"
echo '{"hello": "world"}' >"$OUT/other.json"
expect_error 2 "other.json: not a benchmark result" other-json -- "$OUT/other.json"
expect_error 1 "--out: cannot write '$OUT/no-such-dir/r.html'" unwritable \
  -- "$OUT/run" --out "$OUT/no-such-dir/r.html"
[ ! -e "$OUT/no-such-dir" ] || fail "unwritable: created something"

# 5. A look, as a person gets it (only with chromium).
if command -v chromium >/dev/null 2>&1; then
  for pair in "run/report.html:plot.png" "bench/bench.html:plot-bench.png"; do
    html=${pair%%:*} png=${pair##*:}
    rm -f "$OUT/$png"
    # (--run-all-compositor-stages-before-draw: else the lower part of the
    # window can be captured before it is painted.)
    timeout 60 chromium --headless=new --no-sandbox --disable-gpu \
      --hide-scrollbars --window-size=1200,1600 \
      --run-all-compositor-stages-before-draw --screenshot="$OUT/$png" \
      "file://$OUT/$html" >/dev/null 2>&1 || true
    [ -s "$OUT/$png" ] || fail "chromium wrote no $OUT/$png"
    echo "ok   rendered $OUT/$png"
  done
else
  echo "skip chromium not on PATH: no screenshot"
fi
echo "PASS plot_cli"

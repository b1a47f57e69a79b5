#!/usr/bin/env bash
# Watching a cluster as an operator does: a controller with --http and a
# worker with two cards; `fusionrl status` shows the idle cluster before any
# job; a fused StaleSync job with run.tensorboard runs, and meanwhile
#   * /metrics is scraped and checked line by line against the Prometheus
#     text format (and for the families docs/observability.md lists),
#   * headless Chromium loads the dashboard: the DOM shows both cards as
#     fused and the curves with the committed steps; a screenshot goes to
#     WORK_DIR/dashboard.png,
#   * `status --watch` refreshes;
# at the end the TensorBoard event files are read back by an independent
# reader (tests/read_tfevents.py) and match metrics.jsonl, and `fusionrl
# plot` makes a report of the run.
# Usage: $0 FUSIONRL_BINARY WORK_DIR
set -euo pipefail
BIN=$1
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT"
mkdir -p "$OUT"
CFG="$HERE/data/tiny.yaml"
# shellcheck source=cluster_lib.sh
source "$HERE/cluster_lib.sh"

start_controller controller --http 127.0.0.1:0 --heartbeat-interval 0.5
ADDR=$CTL_ADDR
deadline=$((SECONDS + 30))
until grep -q '^http on ' "$OUT/controller.out"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the controller printed no 'http on' line"
  sleep 0.2
done
HTTP=$(sed -n 's/^http on //p' "$OUT/controller.out")
echo "ok   controller on $ADDR, http on $HTTP"

# The checks of the running job below (/metrics, the dashboard) take about
# 10 s: the job must outlast them however fast the engine is (its 40 steps
# once took 6 s, and the dashboard showed idle cards), so each step is
# followed by a pause: 40 steps, at least 30 s.
"$BIN" worker --controller "$ADDR" --super-node sn-a --cards 2 --threads 1 \
  --debug-step-delay-ms 750 >"$OUT/worker.out" 2>"$OUT/worker.log" &
PIDS+=("$!")

# The cluster before any job: the node, its two idle cards, "no jobs".
deadline=$((SECONDS + 30))
until "$BIN" status --controller "$ADDR" >"$OUT/status-idle.txt" 2>>"$OUT/status.log" &&
      grep -q 'sn-a' "$OUT/status-idle.txt"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "status never showed the worker: $(cat "$OUT/status-idle.txt")"
  sleep 0.3
done
grep -q '^no jobs' "$OUT/status-idle.txt" || fail "idle status does not say 'no jobs'"
[ "$(grep -c '^  card [01] cpu   idle' "$OUT/status-idle.txt")" -eq 2 ] ||
  fail "idle status does not show two idle cards: $(cat "$OUT/status-idle.txt")"
echo "ok   status without jobs shows the node and its idle cards"
cat "$OUT/status-idle.txt"

job=$("$BIN" submit "$CFG" --controller "$ADDR" --output-dir "$OUT/run" \
      --set placement.mode=fused --set placement.cards_per_super_node=2 \
      --set stalesync.max_policy_lag=1 --set algorithm.decoupled_loss=true \
      --set run.total_steps=40 \
      --set run.eval_every=10 --set run.tensorboard=true 2>>"$OUT/submit.log")
echo "ok   submitted $job"
wait_steps "$OUT/run/metrics.jsonl" 4 120 "$job"

# /metrics, line by line.
curl -fsS "http://$HTTP/metrics" >"$OUT/metrics.txt" || fail "GET /metrics"
/usr/bin/python3 - "$OUT/metrics.txt" "$job" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
job = sys.argv[2]
name = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
label = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
sample = re.compile(rf"({name})(?:\{{{label}(?:,{label})*\}})? (NaN|[+-]Inf|[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)$")
families, family, ftype, problems = {}, None, None, []
for n, line in enumerate(text.split("\n")[:-1], 1):
    if m := re.fullmatch(rf"# HELP ({name}) \S.*", line):
        family = m[1]
        if family in families: problems.append(f"line {n}: {family} twice")
        families[family] = None
    elif m := re.fullmatch(rf"# TYPE ({name}) (counter|gauge|histogram)", line):
        if m[1] != family: problems.append(f"line {n}: TYPE of {m[1]} after HELP of {family}")
        families[family] = ftype = m[2]
    elif m := sample.fullmatch(line):
        ok = {family} if ftype != "histogram" else {family + s for s in ("_bucket", "_sum", "_count")}
        if m[1] not in ok: problems.append(f"line {n}: sample {m[1]} under family {family}")
    else:
        problems.append(f"line {n}: not the text format: {line!r}")
assert text.endswith("\n"), "no final newline"
need = ["fusionrl_job_step", "fusionrl_job_tokens_per_second", "fusionrl_job_reward_mean",
        "fusionrl_job_max_staleness", "fusionrl_job_groups_trained_total",
        "fusionrl_card_busy_fraction", "fusionrl_card_memory_bytes",
        "fusionrl_node_heartbeat_age_seconds", "fusionrl_rpc_requests_total",
        "fusionrl_rpc_latency_seconds"]
problems += [f"family {f} missing" for f in need if f not in families]
if not re.search(rf'^fusionrl_job_phase\{{job="{job}",phase="running"\}} 1$', text, re.M):
    problems.append("the job is not running in fusionrl_job_phase")
if not re.search(r'^fusionrl_card_busy_fraction\{node="node-1",card="1",role="fused"\} ', text, re.M):
    problems.append("card 1 is not shown fused")
if problems:
    print("FAIL /metrics:\n  " + "\n  ".join(problems)); sys.exit(1)
print(f"ok   /metrics: {len(text.splitlines())} lines in the text format, {len(families)} families")
PY

# The dashboard in a real browser.
CHROME=(timeout 90 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage
        --no-first-run --no-default-browser-check --disable-extensions --hide-scrollbars
        --user-data-dir="$OUT/chromium-profile" --virtual-time-budget=6000)
"${CHROME[@]}" --window-size=1280,1000 --dump-dom "http://$HTTP/" >"$OUT/dashboard.html" 2>"$OUT/chromium.log" ||
  fail "chromium --dump-dom failed"
"${CHROME[@]}" --window-size=1280,1400 --screenshot="$OUT/dashboard.png" "http://$HTTP/" \
  >>"$OUT/chromium.log" 2>&1 || fail "chromium --screenshot failed"
[ -s "$OUT/dashboard.png" ] || fail "no screenshot"
/usr/bin/python3 - "$OUT/dashboard.html" "$job" <<'PY'
import sys
from html.parser import HTMLParser
class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.cards = []; self.curves = {}; self.ready = False
        self.curve = None; self.title = ""; self.in_title = False
    def handle_starttag(self, tag, attrs):
        a = dict(attrs); cls = (a.get("class") or "").split()
        if tag == "body": self.ready = a.get("data-ready") == "1"
        if "card" in cls and "data-role" in a: self.cards.append(a["data-role"])
        if tag == "svg" and "curve" in cls: self.curve = a.get("data-metric")
        if tag in ("polyline", "path") and self.curve and a.get("points", a.get("d")):
            pts = a.get("points")
            self.curves[self.curve] = len(pts.split()) if pts else 1
        if tag == "title": self.in_title = True
    def handle_endtag(self, tag):
        if tag == "svg": self.curve = None
        if tag == "title": self.in_title = False
    def handle_data(self, d):
        if self.in_title: self.title += d
p = P(); p.feed(open(sys.argv[1]).read())
problems = []
if not p.ready: problems.append("body has no data-ready=1 (the page never rendered /api/status)")
if p.cards.count("fused") != 2: problems.append(f"cards shown: {p.cards}, want two fused")
if p.curves.get("reward_mean", 0) < 3: problems.append(f"reward curve points: {p.curves}")
if "tiny" not in p.title: problems.append(f"title {p.title!r} does not name the job")
if problems:
    print("FAIL dashboard:\n  " + "\n  ".join(problems)); sys.exit(1)
print(f"ok   dashboard in headless Chromium: cards {p.cards}, curves {p.curves}, title {p.title!r}")
PY

# status --watch refreshes (not a terminal: one block per refresh). Counted,
# not timed: on a loaded machine the first block can take seconds to come.
"$BIN" status --controller "$ADDR" --watch --interval 0.5 >"$OUT/watch.txt" 2>>"$OUT/status.log" &
watch_pid=$!
deadline=$((SECONDS + 60))
until [ "$(grep -c '^controller ' "$OUT/watch.txt" || true)" -ge 3 ]; do
  if [ "$SECONDS" -ge "$deadline" ] || ! kill -0 "$watch_pid" 2>/dev/null; then
    kill "$watch_pid" 2>/dev/null || true
    fail "status --watch printed $(grep -c '^controller ' "$OUT/watch.txt" || true) block(s) in 60 s, not 3"
  fi
  sleep 0.2
done
kill "$watch_pid" 2>/dev/null || true
wait "$watch_pid" 2>/dev/null || true
echo "ok   status --watch refreshes ($(grep -c '^controller ' "$OUT/watch.txt") blocks)"

wait_job "$ADDR" "$job" "$OUT/status-final.json" 300
phase=$(phase_of "$ADDR" "$job" "$OUT/status-final.json")
[ "$phase" = JOB_PHASE_SUCCEEDED ] || fail "$job ended $phase"

# TensorBoard: an independent reader agrees with metrics.jsonl.
/usr/bin/python3 "$HERE/read_tfevents.py" "$OUT/run/tensorboard" \
  --check-against "$OUT/run/metrics.jsonl" >"$OUT/tfevents-check.txt" 2>&1 ||
  { cat "$OUT/tfevents-check.txt"; fail "TensorBoard events disagree with metrics.jsonl"; }
echo "ok   TensorBoard events: $(tail -1 "$OUT/tfevents-check.txt")"

# A report of the run.
if "$BIN" plot "$OUT/run" --out "$OUT/report.html" >"$OUT/plot.out" 2>"$OUT/plot.log"; then
  grep -q '<svg' "$OUT/report.html" || fail "the report has no chart"
  echo "ok   fusionrl plot wrote $OUT/report.html"
else
  cat "$OUT/plot.log"; fail "fusionrl plot failed"
fi
echo "PASS: observability"

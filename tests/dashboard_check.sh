#!/usr/bin/env bash
# The controller's web page (src/controller/outputs/dashboard.html) in headless
# Chromium against fixed api/status answers: the example in
# docs/dashboard/api-status-example.json, a cluster with no jobs, one with no
# workers, a job with 2000 history points, and an api/status that answers 404.
# Each page is served by python's http.server from its own folder
# (FIXTURE/index.html + FIXTURE/api/status) and read back with --dump-dom;
# screenshots of the example and the empty cases go to OUT_DIR.
# Usage: $0 [OUT_DIR]      (default: a fresh temporary folder)
# Env:   CHROMIUM=/path/to/chromium   DASHBOARD=/path/to/dashboard.html
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PAGE=${DASHBOARD:-$ROOT/src/controller/outputs/dashboard.html}
EXAMPLE=$ROOT/docs/dashboard/api-status-example.json
OUT=${1:-$(mktemp -d /tmp/dashboard_check.XXXXXX)}
PY=/usr/bin/python3

fail() { echo "FAIL dashboard: $*" >&2; exit 1; }

CHROME=${CHROMIUM:-}
if [ -z "$CHROME" ]; then
  for c in chromium chromium-browser google-chrome; do
    if command -v "$c" >/dev/null 2>&1; then CHROME=$(command -v "$c"); break; fi
  done
fi
[ -n "$CHROME" ] || fail "no chromium on PATH (apt-get install --no-install-recommends chromium)"
[ -f "$PAGE" ] || fail "no page at $PAGE"
[ -f "$EXAMPLE" ] || fail "no example at $EXAMPLE"
if grep -q ')html"' "$PAGE"; then fail "$PAGE contains )html\" and cannot be a C++ raw string R\"html(...)html\""; fi

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/dashboard_fixture.XXXXXX)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Fixtures: one folder each, with the page as index.html and the answer as api/status.
"$PY" - "$EXAMPLE" "$WORK" <<'EOF'
import copy, json, math, os, sys
example = json.load(open(sys.argv[1]))
work = sys.argv[2]
def write(name, status):
    os.makedirs(os.path.join(work, name, "api"), exist_ok=True)
    if status is not None:
        with open(os.path.join(work, name, "api", "status"), "w") as f:
            json.dump(status, f)
write("example", example)
nojobs = copy.deepcopy(example)
nojobs["jobs"] = []
for n in nojobs["nodes"]:
    n["job_id"] = ""
    for c in n["cards"]:
        c.update(role="idle", busy_fraction=0.0, memory_bytes={}, activity="", activity_seconds=0)
write("nojobs", nojobs)
nonodes = copy.deepcopy(example)
nonodes["nodes"] = []
nonodes["super_nodes"] = []
nonodes["jobs"][0]["phase"] = "waiting_for_capacity"
write("nonodes", nonodes)
big = copy.deepcopy(example)
n = 2000
j = big["jobs"][0]
j.update(step=n, total_steps=n, policy_version=n)
j["history"] = {
    "step": list(range(1, n + 1)),
    "reward_mean": [round(0.1 + 0.6 * (1 - math.exp(-i / 500)) + 0.03 * math.sin(i / 7), 4) for i in range(n)],
    "train_accuracy": [round(0.1 + 0.5 * (1 - math.exp(-i / 600)), 4) for i in range(n)],
    "tokens_per_second": [round(1500 + 400 * math.sin(i / 50), 1) for i in range(n)],
    "max_staleness": [min(2, i // 40) + (1 if i % 211 == 0 and i else 0) for i in range(n)],
    "eval_step": list(range(0, n + 1, 100)),
    "eval_accuracy": [round(0.12 + 0.5 * (1 - math.exp(-s / 700)), 4) for s in range(0, n + 1, 100)],
}
j["events"] = [{"time_us": 1796428720000000 + i * 1000000, "text": "event %d" % i} for i in range(60)]
write("big", big)
write("missing", None)  # no api/status: the page must show the 404
EOF
for f in example nojobs nonodes big missing; do cp "$PAGE" "$WORK/$f/index.html"; done

# The server picks a free port itself (port 0) and prints it.
"$PY" -u -m http.server 0 --bind 127.0.0.1 --directory "$WORK" >"$OUT/server.log" 2>&1 &
SERVER_PID=$!
PORT=
for _ in $(seq 1 100); do
  PORT=$(sed -n 's/.*Serving HTTP on [0-9.]* port \([0-9]*\).*/\1/p' "$OUT/server.log" | head -n1)
  [ -n "$PORT" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || fail "fixture server exited: $(cat "$OUT/server.log")"
  sleep 0.1
done
[ -n "$PORT" ] || fail "fixture server printed no port within 10 s: $(cat "$OUT/server.log")"
BASE=http://127.0.0.1:$PORT

# Headless Chromium: --virtual-time-budget lets the page's fetch and first
# render finish before the DOM is dumped or the screenshot taken; a fresh
# profile per run so runs never share (or lock) one.
chrome() {
  local prof
  prof=$(mktemp -d "$WORK/profile.XXXXXX")
  timeout 60 "$CHROME" --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --no-default-browser-check --disable-extensions --hide-scrollbars \
    --user-data-dir="$prof" --virtual-time-budget=5000 "$@" 2>>"$OUT/chromium.log"
}

dump() {  # dump NAME -> $OUT/NAME.html
  chrome --window-size=1280,1000 --dump-dom "$BASE/$1/" >"$OUT/$1.html" ||
    fail "chromium --dump-dom of $1 failed (rc $?), see $OUT/chromium.log"
}
shot() {  # shot NAME HEIGHT -> $OUT/NAME.png
  rm -f "$OUT/$1.png"
  chrome --window-size=1280,"$2" --screenshot="$OUT/$1.png" "$BASE/$1/" >/dev/null ||
    fail "chromium --screenshot of $1 failed (rc $?), see $OUT/chromium.log"
  [ -s "$OUT/$1.png" ] || fail "chromium wrote no screenshot $OUT/$1.png"
}

# Wall time per dump: under virtual time the page's own clocks stand still
# while its script runs, so the 2000-point render is timed from outside.
for f in example nojobs nonodes big missing; do
  t0=$(date +%s%N)
  dump "$f"
  echo $(( ($(date +%s%N) - t0) / 1000000 )) >"$OUT/$f.ms"
done

"$PY" - "$OUT" <<'EOF'
import re, sys
from html.parser import HTMLParser
out = sys.argv[1]

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

class Dom(HTMLParser):
    """Elements as (tag, attrs, parent index) plus text per element."""
    def __init__(self):
        super().__init__()
        self.els, self.stack, self.text = [], [], {}
    def handle_starttag(self, tag, attrs):
        self.els.append((tag, dict(attrs), self.stack[-1] if self.stack else -1))
        if tag not in VOID:
            self.stack.append(len(self.els) - 1)
    def handle_startendtag(self, tag, attrs):
        self.els.append((tag, dict(attrs), self.stack[-1] if self.stack else -1))
    def handle_endtag(self, tag):
        while self.stack:
            i = self.stack.pop()
            if self.els[i][0] == tag:
                break
    def handle_data(self, data):
        for i in self.stack:
            self.text[i] = self.text.get(i, "") + data
    def cls(self, name):
        return [i for i, e in enumerate(self.els) if name in (e[1].get("class") or "").split()]
    def inside(self, i, anc):
        while i >= 0:
            if i == anc:
                return True
            i = self.els[i][2]
        return False
    def by_id(self, id_):
        return next((i for i, e in enumerate(self.els) if e[1].get("id") == id_), None)
    def hidden(self, id_):
        return "hidden" in self.els[self.by_id(id_)][1]

errors = []
def check(name, cond, what):
    print(("ok   " if cond else "FAIL ") + name + ": " + what)
    if not cond:
        errors.append(name + ": " + what)

def load(name):
    src = open(f"{out}/{name}.html", encoding="utf-8").read()
    d = Dom(); d.feed(src)
    body = next((e for e in d.els if e[0] == "body"), ("body", {}, -1))
    title = re.search(r"<title>(.*?)</title>", src, re.S)
    return src, d, body[1], title.group(1) if title else ""

def curve_points(d, metric):
    """Point count of the first polyline/path of svg.curve[data-metric=metric]."""
    svg = next((i for i in d.cls("curve") if d.els[i][0] == "svg" and d.els[i][1].get("data-metric") == metric), None)
    if svg is None:
        return None
    for i, e in enumerate(d.els):
        if e[0] in ("polyline", "path") and d.inside(i, svg):
            pts = e[1].get("points") or e[1].get("d") or ""
            return len(re.findall(r"-?[\d.]+\s*,\s*-?[\d.]+", pts))
    return 0

def events(src):
    """Event texts in the order the events section lists them."""
    sec = src.split('id="events"', 1)[1].split("</section>", 1)[0] if 'id="events"' in src else ""
    return re.findall(r"<li><time>[^<]*</time><span>([^<]*)</span></li>", sec)

METRICS = ("reward_mean", "train_accuracy", "tokens_per_second", "max_staleness")

src, d, body, title = load("example")
check("example", body.get("data-ready") == "1", 'body has data-ready="1"')
check("example", body.get("data-state") == "ok", 'body has data-state="ok"')
cards = d.cls("card")
check("example", len(cards) == 4, f"4 class=card elements (found {len(cards)})")
roles = sorted(d.els[i][1].get("data-role") for i in cards)
check("example", roles == ["fused", "fused", "idle", "idle"], f"card data-role fused x2, idle x2 (found {roles})")
check("example", len(d.cls("node")) == 2, f"2 class=node elements (found {len(d.cls('node'))})")
for m in METRICS:
    n = curve_points(d, m)
    check("example", n == 12, f"svg.curve[data-metric={m}] has a polyline with 12 points (found {n})")
check("example", "quickstart step 12/40" in title, f"title names the job and step (title {title!r})")
check("example", not d.hidden("clocksec"), "StaleSync clocks shown")
check("example", len(d.cls("crow")) == 2, "two clock bars")
ev = events(src)
check("example", ev == ["checkpoint step_10", "placed on node-1 (sn-0), node-3 (sn-1)"], f"events newest first ({ev})")
check("example", "0.4.0" in src and "127.0.0.1:50051" in src, "header shows version and address")
check("example", "kv_cache" in src and "19.0 MiB" in src, "memory legend and card total in MiB")

src, d, body, title = load("nojobs")
check("nojobs", body.get("data-ready") == "1", 'body has data-ready="1"')
check("nojobs", "No jobs" in src, "says No jobs")
check("nojobs", title.endswith("idle"), f"title says idle ({title!r})")
check("nojobs", len(d.cls("card")) == 4, "the 4 idle cards still shown")
check("nojobs", d.hidden("curvesec") and d.hidden("clocksec") and d.hidden("eventsec"), "curves, clocks and events hidden")

src, d, body, title = load("nonodes")
check("nonodes", body.get("data-ready") == "1", 'body has data-ready="1"')
check("nonodes", "No workers registered" in src, "says No workers registered")
check("nonodes", len(d.cls("card")) == 0 and len(d.cls("node")) == 0, "no card or node boxes")
check("nonodes", curve_points(d, "reward_mean") == 12, "curves still drawn")

src, d, body, title = load("big")
check("big", body.get("data-ready") == "1", 'body has data-ready="1"')
for m in METRICS:
    n = curve_points(d, m)
    check("big", n == 2000, f"svg.curve[data-metric={m}] has 2000 points (found {n})")
ms_big, ms_ex = (int(open(f"{out}/{n}.ms").read()) for n in ("big", "example"))
check("big", ms_big < ms_ex + 8000, f"2000-point page loaded in {ms_big} ms (example {ms_ex} ms; allowed + 8000)")
ev = events(src)
check("big", len(ev) == 20, f"only the last 20 events (found {len(ev)})")
check("big", ev[:1] == ["event 59"] and ev[-1:] == ["event 40"], "events are the newest 20, newest first")
check("big", "step 2000/2000" in title, f"title {title!r}")

src, d, body, title = load("missing")
check("missing", body.get("data-state") == "error", 'body has data-state="error"')
check("missing", "data-ready" not in body, "not ready")
check("missing", "HTTP 404" in src, "status line names HTTP 404")

if errors:
    print("\n".join(["", "FAIL dashboard DOM checks:"] + errors), file=sys.stderr)
    sys.exit(1)
EOF

shot example 900
shot nojobs 900
shot nonodes 900
shot big 1800
echo "ok   dashboard: DOM checks passed; screenshots in $OUT (example.png, nojobs.png, nonodes.png, big.png)"

# Shell helpers of the cluster tests (cluster_test.sh, chaos_test.sh):
# process bookkeeping, waits with deadlines, the controller's start and the
# Python checks shared by their result blocks. Source it after setting BIN
# (the fusionrl binary) and OUT (the test's work directory, which exists).

# Every process started here is killed on exit, whatever the outcome; on a
# failure the tails of their logs say why, and then the failed checks are
# repeated last (with the nodes' states a check block printed), where a
# shortened CI log still shows them. The test's own output is copied to
# $OUT/transcript.txt for that.
exec > >(tee "$OUT/transcript.txt")
PIDS=()
on_exit() {
  local rc=$?
  local p
  for p in ${PIDS[@]+"${PIDS[@]}"}; do kill -KILL "$p" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    local f
    for f in "$OUT"/*.log; do
      [ -s "$f" ] || continue
      echo "---- last lines of $f"
      tail -n 20 "$f"
    done
    echo "---- failed checks (repeated from above)"
    grep -E '^(FAIL |     node: )' "$OUT/transcript.txt" || true
  fi
}
trap on_exit EXIT
forget() {  # drop a reaped pid so the exit trap never signals a reused one
  local keep=() p
  for p in ${PIDS[@]+"${PIDS[@]}"}; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=(${keep[@]+"${keep[@]}"})
}
fail() { echo "FAIL $*"; exit 1; }
# kill_hard PID: SIGKILL, reap (silencing the shell's "Killed" notice) and
# forget it.
kill_hard() {
  kill -KILL "$1"
  { wait "$1"; } 2>/dev/null || true
  forget "$1"
}
# wait_steps FILE N SECONDS WHAT: until metrics file FILE has N lines.
wait_steps() {
  local file=$1 n=$2 limit=$3 what=$4
  local deadline=$((SECONDS + limit))
  until [ -f "$file" ] && [ "$(wc -l < "$file")" -ge "$n" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what wrote fewer than $n steps in $limit s"
    sleep 0.1
  done
}
# outage_marks LOG...: how many "controller unreachable" lines each worker
# log holds (before a controller is killed).
outage_marks() {
  local log
  for log in "$@"; do grep -c "controller unreachable" "$log" || true; done
}
# wait_outage SECONDS "MARKS" LOG...: until every LOG holds more
# "controller unreachable" lines than its count in MARKS (outage_marks
# before the kill): each worker saw the controller go away, which a fixed
# pause before the restart did not check.
wait_outage() {
  local limit=$1 marks=($2) deadline=$((SECONDS + $1)) i
  shift 2
  local logs=("$@")
  for i in "${!logs[@]}"; do
    until [ "$(grep -c "controller unreachable" "${logs[$i]}" || true)" -gt "${marks[$i]}" ]; do
      [ "$SECONDS" -lt "$deadline" ] ||
        fail "${logs[$i]}: no 'controller unreachable' within $limit s of the kill"
      sleep 0.1
    done
  done
}
# phase_of ADDR JOB STATUS_JSON: writes `status --json` of JOB to
# STATUS_JSON and prints its phase ("" when the call fails).
phase_of() {
  "$BIN" status --controller "$1" --job "$2" --json >"$3" 2>>"$OUT/status.log" || true
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("phase", ""))' \
    "$3" 2>/dev/null || true
}
# wait_job ADDR JOB STATUS_JSON SECONDS: polls `status --json` into
# STATUS_JSON until the job ends (calls that fail, e.g. while a controller
# restarts, are retried).
wait_job() {
  local addr=$1 job=$2 out=$3 limit=$4 phase
  local deadline=$((SECONDS + limit))
  while :; do
    phase=$(phase_of "$addr" "$job" "$out")
    case "$phase" in JOB_PHASE_SUCCEEDED|JOB_PHASE_FAILED|JOB_PHASE_CANCELLED) return ;; esac
    [ "$SECONDS" -lt "$deadline" ] || fail "$job not finished within $limit s (phase '$phase')"
    sleep 0.5
  done
}
# wait_exit PID SECONDS: sets EXIT_RC to the exit status of PID, or to 124
# (after a SIGKILL) if it is still running after SECONDS. Not for $(...): a
# subshell cannot wait for this shell's children.
EXIT_RC=
wait_exit() {
  local pid=$1 limit=$2 late=0
  timeout "$limit" tail --pid="$pid" -f /dev/null || { kill -KILL "$pid" 2>/dev/null || true; late=1; }
  EXIT_RC=0
  wait "$pid" || EXIT_RC=$?
  forget "$pid"
  [ "$late" -eq 0 ] || EXIT_RC=124
}

# Checks shared by the Python blocks below (imported from $OUT).
cat >"$OUT/checks.py" <<'PY'
import json, sys, zipfile

failures = []

def check(cond, what):
    """Prints one claim as ok or FAIL and remembers a failed one."""
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)

def finish():
    """Ends a block of checks: exit status 1 when any failed."""
    sys.exit(1 if failures else 0)

def rows(path):
    return [json.loads(l) for l in open(path)]

def timing(key):
    # Wall-clock figures: the only fields of a step record that may differ
    # between two runs of the same job.
    return key.endswith("_seconds") or key == "tokens_per_second"

def record_diffs(a, b):
    """(step, key, a, b) for every non-timing field that differs."""
    out = []
    if len(a) != len(b):
        out.append((None, "number of steps", len(a), len(b)))
    for x, y in zip(a, b):
        for k in sorted(set(x) | set(y)):
            if not timing(k) and x.get(k) != y.get(k):
                out.append((x.get("step"), k, x.get(k), y.get(k)))
    return out

def groups_once(recs, prompts_per_step, first=0):
    """Every prompt group of the job trained exactly once, seen from the
    cards: count, sum and sum of squares of the trained group ids over the
    run equal those of the contiguous range the job covers, from the data
    cursor it was submitted with (`first`: 0 for a new job, which every job
    of these tests is; not read off the records, so a shifted range fails).
    Returns (ok, text)."""
    n = len(recs) * prompts_per_step
    ids = range(first, first + n)
    want = (n, sum(ids), sum(i * i for i in ids))
    got = tuple(int(sum(r[k] for r in recs)) for k in
                ("trained_groups", "trained_group_id_sum", "trained_group_id_sq_sum"))
    return got == want, f"ids {first}..{first + n - 1}: (count, sum, sum sq) {got}, want {want}"

def optimizer_entries(path):
    # The optimizer state's tensors as a multiset: their order in optim.pt
    # is not stable from run to run (measured), their bytes are.
    z = zipfile.ZipFile(path)
    return sorted((i.CRC, i.file_size) for i in z.infolist() if "/data/" in i.filename)

def same_bytes(p, q):
    return open(p, "rb").read() == open(q, "rb").read()
PY

# start_controller NAME [FLAGS...]: starts a controller on a free port (or
# on $CTL_LISTEN when set) (stdout $OUT/NAME.out, stderr $OUT/NAME.log) and waits, 30 s at most, for
# its "listening on" line; sets CTL_PID and CTL_ADDR. Not for $(...), like
# wait_exit.
CTL_PID=
CTL_ADDR=
start_controller() {
  local name=$1
  shift
  "$BIN" controller --listen "${CTL_LISTEN:-127.0.0.1:0}" "$@" >"$OUT/$name.out" 2>"$OUT/$name.log" &
  CTL_PID=$!
  PIDS+=("$CTL_PID")
  local deadline=$((SECONDS + 30))
  until grep -q '^listening on ' "$OUT/$name.out"; do
    kill -0 "$CTL_PID" 2>/dev/null || fail "$name exited before listening"
    [ "$SECONDS" -lt "$deadline" ] || fail "$name printed no 'listening on' line in 30 s"
    sleep 0.2
  done
  CTL_ADDR=$(sed -n 's/^listening on //p' "$OUT/$name.out")
}

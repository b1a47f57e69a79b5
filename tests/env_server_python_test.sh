#!/usr/bin/env bash
# examples/env_server/calculator_server.py, the Python template of an
# environment server, driven over gRPC by a small Python client: one
# episode (the exact tool result of "347*29", the grading of final
# answers), NOT_FOUND for an unknown episode, and the test knobs
# (--hang-on-step: the client's deadline runs out; --exit-on-step: the call
# fails UNAVAILABLE).
#
# Needs python3 with grpcio and grpcio-tools (Debian: python3-grpcio
# python3-grpc-tools; scripts/install-deps.sh). Without them it skips
# (exit 77), except under CI=true or FUSIONRL_REQUIRE_ALL_TESTS=1 (.ci/run),
# where it fails.
#
#   tests/env_server_python_test.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SERVER=$ROOT/examples/env_server/calculator_server.py

source "$ROOT/tests/grpc_python.sh" env_server_python

WORK=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Starts a server named $1 with the rest as its arguments; wait_port then
# reads its port once it prints "listening on PORT". Both servers start at
# once, beside the client's code generation (a start takes about a second).
declare -A server_pid
start_server() {
  local name=$1; shift
  "$PY" "$SERVER" --port 0 "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  server_pid[$name]=$!
  pids+=("$!")
}
wait_port() {
  local name=$1
  PORT=""
  for _ in $(seq 150); do
    PORT=$(sed -n 's/^listening on \([0-9][0-9]*\)$/\1/p' "$WORK/$name.out")
    [ -n "$PORT" ] && return 0
    kill -0 "${server_pid[$name]}" 2>/dev/null || break
    sleep 0.05
  done
  echo "FAIL: $name server did not print 'listening on PORT'"
  cat "$WORK/$name.out" "$WORK/$name.err"
  exit 1
}
start_server calculator
# Step 1 hangs, step 2 kills the server.
start_server knobs --hang-on-step 1 --exit-on-step 2

# The client: the same stubs, generated from proto/ into $WORK/stubs.
mkdir -p "$WORK/stubs"
"$PY" -m grpc_tools.protoc -I"$ROOT/proto" --python_out="$WORK/stubs" \
  --grpc_python_out="$WORK/stubs" "$ROOT/proto/fusionrl/v1/environment.proto"
cat >"$WORK/client.py" <<'EOF'
import sys

import grpc
from fusionrl.v1 import environment_pb2 as pb
from fusionrl.v1 import environment_pb2_grpc as pb_grpc

mode, port = sys.argv[1], sys.argv[2]
stub = pb_grpc.EnvironmentServiceStub(
    grpc.insecure_channel(f"127.0.0.1:{port}"))
failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


def open_episode(answer):
    problem = pb.EnvProblem(prompt="What is 347*29?", answer=answer)
    return stub.Open(pb.OpenEpisodeRequest(problem=problem, seed=7),
                     timeout=10)


def step(episode_id, timeout=10, **turn):
    return stub.Step(pb.StepEpisodeRequest(
        episode_id=episode_id, turn=pb.EnvAssistantTurn(**turn)),
        timeout=timeout).observation


def calc(expression):
    return pb.EnvToolCall(name="calc",
                          arguments_json=f'{{"expression": "{expression}"}}')


def expect_code(what, code, call):
    try:
        call()
        failures.append(f"{what}: succeeded, want {code.name}")
    except grpc.RpcError as e:
        check(f"{what}: code", e.code(), code)


if mode == "episode":
    opened = open_episode("10063")
    check("Open messages", len(opened.messages), 0)
    check("Open tools", [(t.name, t.description, t.parameters_json)
                         for t in opened.tools],
          [("calc", "Evaluates integer arithmetic: + - * / and parentheses",
            '{"type": "object", "properties": {"expression": {"type": '
            '"string", "description": "e.g. 347*29"}}, "required": '
            '["expression"]}')])
    eid = opened.episode_id
    obs = step(eid, index=0, text="...", content="",
               tool_calls=[calc("347*29"), calc("7/2"), calc("(2+3)*-4")],
               call_errors=["tool call 4: no tool named 'search'"])
    check("tool messages", [(m.role, m.content) for m in obs.messages],
          [("tool", "10063"),
           ("tool", "error: division 7/2 is not exact (at position 2); "
                    "only exact integer division is supported"),
           ("tool", "-20")])
    check("tool turn done", obs.done, False)
    check("tool turn has reward", obs.HasField("reward"), False)
    check("tool turn metrics", dict(obs.metrics), {"calc_calls": 3.0})
    bad = pb.EnvToolCall(name="calc", arguments_json='{"expr": 1}')
    obs = step(eid, index=1, tool_calls=[bad])
    check("bad arguments", obs.messages[0].content,
          'error: calc takes {"expression": "<arithmetic>"}')
    obs = step(eid, index=2, text=" 10063\n", content=" 10063\n")
    check("final done", obs.done, True)
    check("final messages", len(obs.messages), 0)
    check("final reward", (obs.HasField("reward"), obs.reward), (True, 1.0))
    check("final correct", (obs.HasField("correct"), obs.correct),
          (True, True))
    stub.Close(pb.CloseEpisodeRequest(episode_id=eid), timeout=10)
    expect_code("Step after Close", grpc.StatusCode.NOT_FOUND,
                lambda: step(eid, index=3, content="10063"))

    wrong = open_episode("10063").episode_id
    obs = step(wrong, index=0, content="10064")
    check("wrong reward", (obs.HasField("reward"), obs.reward), (True, 0.0))
    check("wrong correct", (obs.HasField("correct"), obs.correct),
          (True, False))
    expect_code("unknown episode", grpc.StatusCode.NOT_FOUND,
                lambda: step("no-such-episode", content="1"))
elif mode == "knobs":  # --hang-on-step 1 --exit-on-step 2
    eid = open_episode("1").episode_id
    expect_code("hung Step", grpc.StatusCode.DEADLINE_EXCEEDED,
                lambda: step(eid, timeout=1, content="1"))
    expect_code("Step of a dying server", grpc.StatusCode.UNAVAILABLE,
                lambda: step(eid, content="1"))

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
EOF
client() { PYTHONPATH="$WORK/stubs" timeout 20 "$PY" "$WORK/client.py" "$@"; }

wait_port calculator
client episode "$PORT"
echo "ok   one episode: calc(347*29) = 10063, graded answers, NOT_FOUND"

wait_port knobs
client knobs "$PORT"
rc=0
wait "${server_pid[knobs]}" || rc=$?
[ "$rc" = 1 ] || { echo "FAIL: --exit-on-step server exited $rc, want 1"; exit 1; }
echo "ok   --hang-on-step: DEADLINE_EXCEEDED; --exit-on-step: UNAVAILABLE, exit 1"
echo "PASS: env_server_python"

# Sourced by the tests of examples/env_server/: sets PY to the first python3
# with the grpc and grpc_tools modules (PATH may start with a python3 of its
# own, pyenv or a venv, beside Debian's). Without one the test skips (exit
# 77), except under CI=true or FUSIONRL_REQUIRE_ALL_TESTS=1 (.ci/run), where
# it fails. $1: the test's name, for the message.
PY=""
for candidate in "${FUSIONRL_PYTHON:-}" python3 /usr/bin/python3; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c "import grpc, grpc_tools.protoc" >/dev/null 2>&1; then
    PY=$candidate
    break
  fi
done
if [ -z "$PY" ]; then
  msg="$1: no python3 with the grpc and grpc_tools modules (apt-get install python3-grpcio python3-grpc-tools)"
  if [ "${CI:-}" = "true" ] || [ "${FUSIONRL_REQUIRE_ALL_TESTS:-0}" = 1 ]; then
    echo "FAIL: $msg"
    exit 1
  fi
  echo "SKIP: $msg"
  exit 77
fi

#!/usr/bin/env bash
# Installs FusionRL from BUILD_DIR into a temporary prefix, then builds every
# project under examples/ against it as a separate CMake project (the way a
# user does) and runs it. ctest `examples_installed`.
#   scripts/test-examples.sh BUILD_DIR OUT_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
OUT=$2
SRC=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$OUT"
mkdir -p "$OUT"
PREFIX="$OUT/prefix"

echo "== cmake --install $BUILD --prefix $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >"$OUT/install.log"
for f in include/fusionrl/job.h include/fusionrl/observer.h \
         include/fusionrl/cluster.h include/fusionrl/version.h \
         lib/cmake/FusionRL/FusionRLConfig.cmake \
         lib/cmake/FusionRL/FusionRLConfigVersion.cmake bin/fusionrl; do
  [ -e "$PREFIX/$f" ] || { echo "FAIL: the install has no $f"; exit 1; }
done
# Nothing a user includes may reach into src/.
if grep -rn '#include "\(core\|controller\|worker\|engine\|rpc\|tasks\|hf\)/' \
     "$PREFIX/include"; then
  echo "FAIL: an installed header includes a src/ header"; exit 1
fi
version=$("$PREFIX/bin/fusionrl" --version)
expected=$(sed -n 's/^project(FusionRL VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
[ "$version" = "$expected" ] ||
  { echo "FAIL: fusionrl --version says '$version', the project is $expected"; exit 1; }
echo "ok   installed FusionRL $version"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
linker=()
command -v ld.lld >/dev/null && linker=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld)
build_example() {
  local name=$1
  echo "== build examples/$name against the installed package"
  cmake -S "$SRC/examples/$name" -B "$OUT/$name" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
        "${launcher[@]}" "${linker[@]}" >"$OUT/$name.configure.log" 2>&1 ||
    { cat "$OUT/$name.configure.log"; echo "FAIL: configure $name"; exit 1; }
  cmake --build "$OUT/$name" >"$OUT/$name.build.log" 2>&1 ||
    { tail -40 "$OUT/$name.build.log"; echo "FAIL: build $name"; exit 1; }
}
run_example() {
  local name=$1; shift
  echo "== run $name $*"
  if ! timeout 300 "$OUT/$name/$name" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; then
    tail -20 "$OUT/$name.err"; cat "$OUT/$name.out"; echo "FAIL: $name exited non-zero"; exit 1
  fi
  cat "$OUT/$name.out"
}

build_example custom_reward
run_example custom_reward "$OUT/run-custom" 3
grep -q '^steps 3,' "$OUT/custom_reward.out" || { echo "FAIL: custom_reward ran no 3 steps"; exit 1; }
# The reward is ours: partial credit shows up as fractions in the records.
/usr/bin/python3 - "$OUT/run-custom/metrics.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in recs] == [1, 2, 3], [r["step"] for r in recs]
fractional = [r["reward_mean"] for r in recs if r["reward_mean"] not in (0, 1)]
assert fractional, "no partial-credit reward in metrics.jsonl"
print("ok   custom reward: 3 records, partial-credit rewards", fractional)
PY

build_example early_stop
run_example early_stop "$OUT/run-stop" 0.0
grep -q '^stopped early after step' "$OUT/early_stop.out" ||
  { echo "FAIL: early_stop did not stop early"; exit 1; }
grep -q '^step 1 ' "$OUT/early_stop.out" || { echo "FAIL: the observer saw no step 1"; exit 1; }
grep -q '^eval at step 0:' "$OUT/early_stop.out" || { echo "FAIL: the observer saw no initial eval"; exit 1; }
grep -q '^checkpoint after step' "$OUT/early_stop.out" ||
  { echo "FAIL: the observer saw no checkpoint"; exit 1; }
[ -f "$OUT/run-stop/summary.json" ] || { echo "FAIL: no summary.json"; exit 1; }
echo "ok   early_stop: stopped by its observer, checkpointed"

build_example embedded_cluster
run_example embedded_cluster "$OUT/run-cluster" 6
grep -q '^done: 6 steps' "$OUT/embedded_cluster.out" ||
  { echo "FAIL: embedded_cluster did not finish 6 steps"; exit 1; }
echo "ok   embedded_cluster: controller + 2 workers in one process, 6 steps"
echo "PASS: examples built against the installed package and ran"

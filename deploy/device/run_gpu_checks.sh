#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, from .device/bundle.tar.gz
# (made by deploy/device/bundle.sh): the test suite, compute-sanitizer's
# memcheck and racecheck over it, the benchmark beside PyTorch, where the GPU
# starts to beat the CPU (for --cuda_min_flops), and the server on the GPU
# under load with batching off and on (attnctl load; stored memories too;
# perf_analyzer when it runs there).
#
#   bash deploy/device/run_gpu_checks.sh [STEP...]   # default: all
#
# STEP: tests, sanitize, bench, kernel, crossover, serve, memory, stored,
# perf_analyzer, or all. `kernel`: a stored memory on the GPU, our kernel
# alone and whole calls (cuda_memory_bench) beside PyTorch's with the memory
# resident (bench/torch_memory_gpu.py); `stored`: single-query calls on
# stored memories of 65,536-1,048,576 entries, F32 and BF16, at 64 and 256
# in flight, served from the GPU and then from this machine's CPU
# (bench/memory_device_bench.sh). A lease is 15 minutes of device time in all, start included, so it is
# two calls (deploy/device/README.md): `tests bench crossover serve memory`
# (~4 min, at most 6), then `sanitize` (at most 4).
#
# Every step runs under its own time cap (seconds; STEP_LIMIT_<step>
# overrides, e.g. STEP_LIMIT_sanitize=300) so that a hang costs one step,
# not the call; its log and a line in summary.txt are written the moment it
# ends, so a call cut off by the device tool still brings back what finished.
#
# SERVE_DURATION (default 4s) is each load row's length in `serve` and
# `memory`.
#
# Writes logs to $OUT (or /tmp/gpu_checks) and prints the summary; exits
# non-zero when a step fails.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
steps=" ${*:-all} "
for name in $steps; do
  case $name in
    tests|sanitize|bench|kernel|crossover|serve|memory|stored|perf_analyzer|all) ;;
    *) echo "unknown step '$name' (tests, sanitize, bench, kernel, crossover, serve, memory, stored, perf_analyzer, all)" >&2; exit 64 ;;
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
sanitizer=$(command -v compute-sanitizer ||
  find "$cuda_home/bin" /usr/local /opt -maxdepth 6 -name compute-sanitizer -type f 2>/dev/null | head -1)
sanitizer=${sanitizer:-compute-sanitizer}
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
{ nvcc --version | tail -2; nproc; grep -m1 "model name" /proc/cpuinfo; } >>"$out/gpu.txt" 2>&1
summary=$out/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
# The time caps (seconds), sized from the lease's plan: expected times are in
# deploy/device/README.md.
declare -A limit=([tests]=120 [memcheck]=150 [racecheck]=100 [bench]=100
                  [kernel]=120 [crossover]=60 [serve]=110 [memory]=80
                  [stored]=240 [perf_analyzer]=300)
status=0
step() {  # step NAME COMMAND...: runs under its cap, logs to $out/NAME.log
  local name=$1; shift
  local start=$SECONDS
  local cap_var="STEP_LIMIT_$name"
  local cap=${!cap_var:-${limit[$name]}}
  timeout --kill-after=5 "$cap" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  if [[ $rc == 0 ]]; then
    say "PASS $name ($((SECONDS - start)) s)"
    return 0
  fi
  if [[ $rc == 124 || $rc == 137 ]]; then
    say "FAIL $name: stopped at its ${cap} s cap (STEP_LIMIT_$name)"
  else
    say "FAIL $name ($((SECONDS - start)) s, exit $rc)"
  fi
  tail -25 "$out/$name.log" | sed 's/^/  | /' | tee -a "$summary"
  status=1
  return 1
}
if wants tests; then
  step tests "$root/run/cuda_backend_test"
  grep -E "^\[  (PASSED|FAILED) " "$out/tests.log" | tee -a "$summary"
  # Here a skipped test means the GPU is not usable: that is a failure.
  if grep -q "^\[  SKIPPED \]" "$out/tests.log"; then
    say "FAIL tests: skipped on a GPU machine: $(grep -m1 'no usable GPU' "$out/tests.log")"
    status=1
  fi
fi
if wants sanitize; then
  # Within the lease: memcheck over every case but the largest, racecheck
  # over the kernels that share memory between threads (the fused attention
  # sweep at two precisions, and the other operations).
  declare -A filter=(
    [memcheck]='--gtest_filter=-CudaResourcesTest.FusedAttentionMemoryIsLinearInLength'
    [racecheck]='--gtest_filter=Sweep/CudaAttentionTest.*fp32*:Sweep/CudaAttentionTest.*bf16*:CudaOpsTest.*:Memory/CudaSplitKeysTest.*q17k4097*:Memory/CudaSplitKeysTest.*q1k20011d64*')
  for tool in memcheck racecheck; do
    step "$tool" "$sanitizer" --tool "$tool" --error-exitcode 1 \
      "$root/run/cuda_backend_test" "${filter[$tool]}"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$out/$tool.log" | tee -a "$summary"
    # compute-sanitizer refuses the GPU on some lent machines (seen on the
    # gVisor ones: "Device not supported", then error 999). That says
    # nothing of our code: say so, and still fail the step.
    if grep -q "Device not supported" "$out/$tool.log"; then
      say "UNAVAILABLE $tool: compute-sanitizer refused this machine's GPU; not a result. Rerun where it runs (the Firecracker machines, the H100s seen so far, ran it)"
    fi
  done
fi
if wants bench; then
  PYTHONUNBUFFERED=1 step bench python3 bench/cuda_bench.py "$root/run/cuda_attention_bench"
  cat "$out/bench.log"
fi
if wants kernel; then
  # shellcheck disable=SC2317  # run by `step`, through bash -c
  kernel_rows() {
    "$root/run/cuda_memory_bench" || return 1
    PYTHONUNBUFFERED=1 python3 bench/torch_memory_gpu.py
  }
  export -f kernel_rows
  export root
  step kernel bash -c kernel_rows
  cat "$out/kernel.log"
fi
if wants crossover; then
  step crossover "$root/run/cuda_crossover_bench"
  grep -E "^(crossover|suggested)" "$out/crossover.log" | tee -a "$summary"
fi
if wants serve; then
  # The issue's cases at 64 in flight (medium: B = 32, L = 64, d = 64), the
  # server on the GPU with its default --cuda_min_flops.
  step serve env ATTNSERVE="$root/run/attnserve" ATTNCTL="$root/run/attnctl" \
    ATTN_GPU_NAME="$(head -1 "$out/gpu.txt" | cut -d, -f1)" MEDIUM_BATCH=32 \
    ATTNSERVE_FLAGS="--backend=cuda ${ATTNSERVE_FLAGS:-}" \
    bash bench/batching_bench.sh "${SERVE_DURATION:-4s}"
  cat "$out/serve.log"
fi
if wants memory; then
  # Single-query requests against stored memories, batching off and on: on
  # the GPU at two sizes, then on this machine's CPU at the larger one.
  # shellcheck disable=SC2317  # run by `step`, through bash -c
  memory_rows() {
    local backend sizes
    for backend in cuda cpu; do
      sizes="65536 262144"
      [[ $backend == cpu ]] && sizes=262144
      echo "## --backend=$backend"
      # shellcheck disable=SC2086  # a size list
      ATTNSERVE="$root/run/attnserve" ATTNCTL="$root/run/attnctl" \
        ATTNSERVE_FLAGS="--backend=$backend ${ATTNSERVE_FLAGS:-}" \
        bash bench/memory_batching_bench.sh "${SERVE_DURATION:-4s}" $sizes || return 1
    done
  }
  export -f memory_rows
  export root
  step memory bash -c memory_rows
  cat "$out/memory.log"
fi
if wants stored; then
  # Every size and type on the GPU, then the CPU at the two larger sizes;
  # then the GPU's two larger F32 memories at 256 in flight with batches of
  # up to 128 calls (the default is 32), for the batch size's choice.
  # STORED_SIZES, STORED_KINDS, STORED_CPU_SIZES narrow the first part;
  # STORED_BATCH128=0 skips the second.
  # shellcheck disable=SC2317  # run by `step`, through bash -c
  stored_rows() {
    # shellcheck disable=SC2086  # a size list
    ATTNSERVE="$root/run/attnserve" ATTNCTL="$root/run/attnctl" \
      CPU_SIZES="${STORED_CPU_SIZES:-262144 1048576}" \
      KINDS="${STORED_KINDS:-memory memory16}" \
      bash bench/memory_device_bench.sh "${SERVE_DURATION:-4s}" \
      ${STORED_SIZES:-65536 262144 1048576} || return 1
    [[ ${STORED_BATCH128:-1} == 0 ]] && return 0
    echo "## --max_batch_size=128"
    ATTNSERVE="$root/run/attnserve" ATTNCTL="$root/run/attnctl" \
      BACKENDS=cuda KINDS=memory CONCURRENCY=256 \
      ATTNSERVE_FLAGS="--max_batch_size=128 ${ATTNSERVE_FLAGS:-}" \
      bash bench/memory_device_bench.sh "${SERVE_DURATION:-4s}" 262144 1048576
  }
  export -f stored_rows
  export root
  step stored bash -c stored_rows
  cat "$out/stored.log"
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
    say "SKIP perf_analyzer: not in the bundle, or it does not run on this machine"
  fi
fi
echo
echo "summary ($out/summary.txt):"
cat "$summary"
exit $status

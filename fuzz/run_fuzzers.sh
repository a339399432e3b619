#!/usr/bin/env bash
# Builds the libFuzzer targets (cold or incremental) and runs each for a
# while. Usage:
#
#   fuzz/run_fuzzers.sh [SECONDS_PER_TARGET]
#
# SECONDS_PER_TARGET: the argument, else $FUZZ_SECONDS, else 60 (`make fuzz
# FUZZ_SECONDS=n` passes it as the argument).
#
# For each target, in order:
#   1. replays every input under fuzz/regressions/<target>/ once (each is a
#      crash found before; it must pass once fixed); for the two service
#      targets (kserve_infer, typed_request), their seeds and regressions
#      once more with batching on (ATTN_FUZZ_BATCHING=1), as
#      `attnserve --batching` serves them;
#   2. fuzzes for SECONDS_PER_TARGET (-max_total_time) from the committed
#      seeds fuzz/corpus/<target>/ plus the work corpus, with the target's
#      dictionary fuzz/dicts/<target>.dict when there is one. New corpus
#      entries go to the work directory only, never to fuzz/corpus/.
# Then prints one line per target: executions per second, coverage (cov: and
# ft: of libFuzzer's final stats), corpus size, and exits non-zero if any
# regression input failed or fuzzing found a crash, leak, timeout or
# out-of-memory; the input is saved and the command that reproduces it is
# printed.
#
# Environment (all optional):
#   FUZZ_SECONDS    seconds per target when no argument is given (default 60)
#   FUZZ_TARGETS    targets to run, space-separated (default: all six)
#   FUZZ_BUILD_DIR  build directory (default fuzz/build, ignored by git)
#   FUZZ_WORK_DIR   work corpora, logs and crash inputs
#                   (default $FUZZ_BUILD_DIR/work)
#   FUZZ_JOBS       build parallelism (default 2)
#   FUZZ_TIMEOUT    seconds one input may take before it counts as a
#                   timeout (default 25)
#   FUZZ_ARGS       more libFuzzer flags for the fuzzing runs
#   FUZZ_NO_BUILD   1: use the binaries as they are
set -uo pipefail

readonly SECONDS_PER_TARGET="${1:-${FUZZ_SECONDS:-60}}"
if (($# > 1)) || ! [[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]] ||
    ((10#$SECONDS_PER_TARGET < 1)); then
  echo "usage: $0 [SECONDS_PER_TARGET] (or FUZZ_SECONDS=n; a whole number >= 1)" >&2
  exit 2
fi

readonly FUZZ_DIR="$(cd "$(dirname "$0")" && pwd)"
readonly ROOT="$(dirname "$FUZZ_DIR")"
readonly ALL_TARGETS="typed_request kserve_infer safetensors model_repository validate kserve_rest"
readonly TARGETS="${FUZZ_TARGETS:-$ALL_TARGETS}"
readonly BUILD_DIR="$(realpath -m "${FUZZ_BUILD_DIR:-$FUZZ_DIR/build}")"
readonly WORK_DIR="$(realpath -m "${FUZZ_WORK_DIR:-$BUILD_DIR/work}")"
readonly JOBS="${FUZZ_JOBS:-2}"
readonly TIMEOUT="${FUZZ_TIMEOUT:-25}"
read -r -a EXTRA_ARGS <<< "${FUZZ_ARGS:-}"

for target in $TARGETS; do
  if [[ " $ALL_TARGETS " != *" $target "* ]]; then
    echo "run_fuzzers: unknown target '$target' (known: $ALL_TARGETS)" >&2
    exit 2
  fi
done

# --- Build -----------------------------------------------------------------
build_seconds=-
if [[ "${FUZZ_NO_BUILD:-0}" != 1 ]]; then
  for tool in clang clang++ cmake; do
    command -v "$tool" >/dev/null || {
      echo "run_fuzzers: $tool not found (deploy/install_deps.sh installs it)" >&2
      exit 1
    }
  done
  if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
    generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    echo "run_fuzzers: configuring $BUILD_DIR"
    cmake -S "$FUZZ_DIR" -B "$BUILD_DIR" "${generator[@]}" \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null || exit 1
  fi
  build_targets=()
  for target in $TARGETS; do build_targets+=(--target "fuzz_$target"); done
  mkdir -p "$WORK_DIR"
  echo "run_fuzzers: building ${TARGETS// /, } (-j$JOBS; log in $WORK_DIR/build.log)"
  build_start=$SECONDS
  if ! cmake --build "$BUILD_DIR" -j"$JOBS" "${build_targets[@]}" \
      >"$WORK_DIR/build.log" 2>&1; then
    tail -n 60 "$WORK_DIR/build.log"
    echo "run_fuzzers: the build failed" >&2
    exit 1
  fi
  build_seconds=$((SECONDS - build_start))
  echo "run_fuzzers: built in $build_seconds s"
fi

# --- Run -------------------------------------------------------------------
# Kernels on one thread (the fuzzer is one); every sanitizer report is fatal
# and symbolized.
export OMP_NUM_THREADS=1
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export ASAN_OPTIONS="detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
for symbolizer in llvm-symbolizer llvm-symbolizer-14; do
  if command -v "$symbolizer" >/dev/null; then
    export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$(command -v "$symbolizer")}"
    break
  fi
done

# The targets' temporary model folders: on tmpfs when there is one, and
# removed at the end even when a crash left them behind.
tmp_base=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && tmp_base=/dev/shm
ATTN_FUZZ_TMPDIR="$(mktemp -d "$tmp_base/attn-fuzz-run.XXXXXX")" || exit 1
export ATTN_FUZZ_TMPDIR
trap 'rm -rf "$ATTN_FUZZ_TMPDIR"' EXIT

failures=0
summary=()

# Prints what a failing input reports: the check or sanitizer message and
# the top of its stack.
print_report() {
  grep -E 'FUZZ_CHECK|ERROR|runtime error|SUMMARY|^ +#[0-9]+ ' "$1" |
    grep -v 'fuzzer::\|libc\.so\|__sanitizer_print\|nptl/\|stdlib/\|signal/\|csu/\| in main \| in _start ' |
    head -n 14 | cut -c1-240
}

# Replays each input a run saved (fork mode's log does not show what the
# inner process reported), then says how to reproduce and keep it.
report_inputs() {
  local target=$1 binary=$2
  shift 2
  local input
  for input in "$@"; do
    echo "run_fuzzers: $target: saved $input, which reports:"
    "$binary" -timeout="$TIMEOUT" "$input" >"$input.log" 2>&1
    print_report "$input.log"
    echo "  reproduce:  OMP_NUM_THREADS=1 $binary $input"
    echo "  keep it as a regression test (replayed first by every run):"
    echo "    mkdir -p $FUZZ_DIR/regressions/$target &&"
    echo "    cp $input $FUZZ_DIR/regressions/$target/<short-name>"
  done
}

for target in $TARGETS; do
  binary="$BUILD_DIR/fuzz_$target"
  if [[ ! -x "$binary" ]]; then
    echo "run_fuzzers: $binary is missing" >&2
    failures=$((failures + 1))
    summary+=("$target|MISSING|-|-|-|-|-")
    continue
  fi
  work="$WORK_DIR/$target"
  artifacts="$WORK_DIR/artifacts/$target"
  mkdir -p "$work/corpus" "$artifacts"
  status=ok

  # 1. Regressions: every saved crash input, each on its own.
  regressions=0
  regression_failures=0
  shopt -s nullglob
  for input in "$FUZZ_DIR/regressions/$target"/*; do
    [[ -f "$input" && "$(basename "$input")" != README* ]] || continue
    regressions=$((regressions + 1))
    log="$work/regression-$(basename "$input").log"
    if ! "$binary" -timeout="$TIMEOUT" -artifact_prefix="$artifacts/regression-" \
        "$input" >"$log" 2>&1; then
      regression_failures=$((regression_failures + 1))
      echo "run_fuzzers: $target: regression input $input FAILS:"
      print_report "$log"
      echo "  reproduce:  OMP_NUM_THREADS=1 $binary $input"
    fi
  done
  shopt -u nullglob
  if ((regression_failures > 0)); then
    status="REGRESSION($regression_failures/$regressions)"
  fi

  # 1b. The service targets' seeds and regressions once more through the
  # batcher, exactly as `attnserve --batching` serves them
  # (fuzz/common/service_harness.h: ATTN_FUZZ_BATCHING=1).
  if [[ $target == kserve_infer || $target == typed_request ]]; then
    batched_inputs=()
    [[ -d "$FUZZ_DIR/corpus/$target" ]] && batched_inputs+=("$FUZZ_DIR/corpus/$target")
    [[ -d "$FUZZ_DIR/regressions/$target" ]] && batched_inputs+=("$FUZZ_DIR/regressions/$target")
    log="$work/batched.log"
    if ((${#batched_inputs[@]} > 0)) &&
       ! ATTN_FUZZ_BATCHING=1 "$binary" -runs=0 -timeout="$TIMEOUT" \
         -artifact_prefix="$artifacts/batched-" "${batched_inputs[@]}" >"$log" 2>&1; then
      echo "run_fuzzers: $target: an input FAILS with batching on (ATTN_FUZZ_BATCHING=1):"
      print_report "$log"
      status="BATCHED-FAILS"
    fi
  fi

  # 2. Fuzzing. (With FUZZ_ARGS="-fork=1 -ignore_crashes=1" libFuzzer keeps
  # going past crashes; they still fail the run.)
  dict=()
  [[ -f "$FUZZ_DIR/dicts/$target.dict" ]] && dict=(-dict="$FUZZ_DIR/dicts/$target.dict")
  seeds=()
  [[ -d "$FUZZ_DIR/corpus/$target" ]] && seeds=("$FUZZ_DIR/corpus/$target")
  log="$work/fuzz.log"
  marker="$work/.started"
  touch "$marker"
  echo "run_fuzzers: $target: ${SECONDS_PER_TARGET}s ($regressions regression inputs replayed first)"
  "$binary" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
    -timeout="$TIMEOUT" -artifact_prefix="$artifacts/" "${dict[@]}" \
    "${EXTRA_ARGS[@]}" "$work/corpus" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  mapfile -t saved < <(find "$artifacts" -maxdepth 1 -type f -newer "$marker" \
                         ! -name 'slow-unit-*' ! -name 'regression-*' \
                         ! -name '*.log' | sort)
  # Fork mode's progress lines end in "oom/timeout/crash: O/T/C".
  counts=$(grep -o 'oom/timeout/crash: [0-9/]*' "$log" | tail -n 1 | sed 's/.*: //')
  found=""
  if [[ -n "$counts" && "$counts" != 0/0/0 ]]; then found="oom/timeout/crash $counts"; fi
  if ((rc != 0)) || [[ -n "$found" ]] || ((${#saved[@]} > 0)); then
    kind=CRASH
    grep -q 'ERROR: libFuzzer: timeout' "$log" && kind=TIMEOUT
    grep -q 'ERROR: libFuzzer: out-of-memory' "$log" && kind=OOM
    grep -q 'ERROR: LeakSanitizer' "$log" && kind=LEAK
    [[ -n "$found" ]] && kind="FOUND($counts)"
    [[ "$status" == ok ]] && status=$kind || status="$status+$kind"
    echo "run_fuzzers: $target: $kind (the whole log is $log)"
    ((${#saved[@]} == 0)) && print_report "$log"
    report_inputs "$target" "$binary" "${saved[@]}"
  fi
  [[ "$status" != ok ]] && failures=$((failures + 1))

  # Final stats: libFuzzer's own, or in fork mode its last progress line.
  execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  last=$(grep -E '^#[0-9]+.* cov: ' "$log" | tail -n 1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<< "$last")
  if [[ -z "$runs" && "$last" =~ ^#([0-9]+):.*\ time:\ ([0-9]+)s ]]; then
    # Fork mode: its coverage counts differ (they include start-up code);
    # replay the corpus once to report the same cov/ft as a plain run.
    runs=${BASH_REMATCH[1]}
    ((BASH_REMATCH[2] > 0)) && execs=$((runs / BASH_REMATCH[2]))
    inited=$("$binary" -runs=0 "$work/corpus" "${seeds[@]}" 2>&1 |
             grep -E '^#[0-9]+.*(INITED|DONE) .* cov: ' | tail -n 1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$inited")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$inited")
    corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<< "$inited")
  fi
  summary+=("$target|$status|${execs:--}|${runs:--}|${cov:--}|${ft:--}|${corp:--}")
done

echo
echo "run_fuzzers: ${SECONDS_PER_TARGET}s per target; build ${build_seconds} s, all ${SECONDS} s;" \
  "logs, work corpora and crash inputs in $WORK_DIR"
printf '%-17s %-30s %9s %10s %6s %7s %14s\n' target status execs/s runs cov ft corpus
for line in "${summary[@]}"; do
  IFS='|' read -r target status execs runs cov ft corp <<< "$line"
  printf '%-17s %-30s %9s %10s %6s %7s %14s\n' \
    "$target" "$status" "$execs" "$runs" "$cov" "$ft" "$corp"
done
echo "(corpus: inputs/bytes in libFuzzer's final corpus, seeds and work corpus together)"
if ((failures > 0)); then
  echo "run_fuzzers: FAILED: $failures target(s)"
  exit 1
fi
echo "run_fuzzers: all targets passed"

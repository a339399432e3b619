#!/usr/bin/env bash
# The test suite under the sanitizers, two passes (CI runs both after
# `make test`; `make sanitize` runs this):
#
#   asan  The whole CTest suite built with AddressSanitizer +
#         UndefinedBehaviorSanitizer, LeakSanitizer on: every gtest binary
#         (kernels in every instruction set's copy, batcher, service in
#         process, client) and the cross-layer tests, which drive the
#         sanitized attnserve and attnctl from outside. Left out, and run by
#         `make test` on the real build: the tests labelled `static`
#         (thread_safety_analysis, isa_objects_*, isa_program_attnserve),
#         which inspect source or machine code, not behaviour, and the
#         instrumentation changes the code they check (extra `__odr_asan.*`
#         globals, unvectorised loops); `container` (the image build,
#         ~5-8 min), which compiles its own unsanitized binaries inside the
#         image; and `faults` (tests/faults), whose bounds are on the
#         unsanitized server's memory and throughput (AddressSanitizer's
#         shadow memory and slowdown are not the product's). The project's
#         own code is compiled at -Og (the kernels keep their -O3), which
#         halves the instrumented build's time against -O2.
#   tsan  ThreadSanitizer over the tests of our concurrent code, which start
#         real threads: the batcher with a real worker pool and scheduler
#         thread (server/execution/batcher_test), the worker pool
#         (server/execution/worker_pool_test), admission's drain wait
#         (server/execution/admission_test), the serving core's call lifecycle
#         with a real pool (server/execution/call_runner_test), and the oneDNN
#         primitive cache, the
#         model repository and the metrics under contention
#         (tests/sanitizers/concurrency_test.cc). Not the in-process gRPC
#         service tests: Debian's gRPC and protobuf are not built with TSan,
#         and the hand-offs inside them (their own atomics) are invisible.
#         server/typed/attention_service_test gave 2,391 reports in a first trial
#         and still 157 with the instrumented Abseil below, none with a
#         frame of ours among the top two of either access (sendmsg,
#         memcpy, free and new inside gRPC's and protobuf's frames); a
#         suppression broad enough to hide them would hide ours too, since
#         every handler of ours runs below gRPC frames.
#
#   tests/sanitizers/run_sanitizers.sh [asan] [tsan]   (both when none given)
#
# Any sanitizer report fails the pass, whether or not the test that ran the
# reporting process noticed: reports are also written to files
# (log_path), and every file counts. Exit 0 only when both passes ran
# clean. Build trees: build-asan/ and build-tsan/ at the repository root
# (override with ASAN_BUILD_DIR / TSAN_BUILD_DIR), each with a .gitignore of
# its own; JOBS (default 2) parallel jobs. A second run rebuilds only what
# changed.
#
# Two things make ThreadSanitizer see what it must, both documented in
# tests/README.md (Beyond CTest):
#  - Debian's Abseil is not instrumented, so absl::Mutex (every lock of
#    ours, and gRPC's) is invisible to TSan, which then reports every
#    guarded access as a race. The pass compiles Abseil's synchronisation
#    sources (absl/synchronization/*.cc, and the LowLevelAlloc they allocate
#    thread identities with; not SpinLock, whose inline fast path is
#    compiled into the uninstrumented libraries) and absl/status/status.cc
#    from Debian's own source package
#    of the installed version, against the installed headers, with
#    -fsanitize=thread, and links them into the test binaries ahead of the
#    shared libraries, so that they interpose: every absl::Mutex, ours and
#    gRPC's, is then annotated for TSan. status.cc for the same reason: an
#    error absl::Status is a shared, reference-counted rep whose copies
#    increment the count inline (instrumented) but whose last release
#    (UnrefNonInlined: an acquire load or an acq_rel decrement, then the
#    delete) lives in the library. Uninstrumented, that hand-over is
#    invisible, and a status copied on one thread and dropped last on
#    another is reported as the delete racing the increment (seen once in
#    CI, in call_runner_test: the worker's status dropped after the test
#    thread had copied the answer). The source comes from Debian's
#    mirror (apt-get source with a private, temporary apt state: the
#    system's apt configuration is not touched) once, and is cached in the
#    build tree.
#  - OpenMP: libgomp is not instrumented either, and its barriers are
#    invisible, so a parallel region on two threads is reported as a race
#    between its threads. The pass runs with OMP_NUM_THREADS=1 (every
#    parallel region on its calling thread alone); the kernels' parallel
#    paths are checked by the ASan pass and by the kernel tests, and the
#    threads we start ourselves (pool, scheduler, clients) stay concurrent.
# tsan.supp holds the suppressions, each for an Abseil-internal frame only
# and each explained; none names a function of ours.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$repo/tests/sanitizers
cd "$repo" || exit 1
jobs=${JOBS:-2}
asan_dir=${ASAN_BUILD_DIR:-$repo/build-asan}
tsan_dir=${TSAN_BUILD_DIR:-$repo/build-tsan}

passes=()
for arg in "$@"; do
  case $arg in
    asan|tsan) passes+=("$arg") ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_sanitizers: unknown argument '$arg' (asan, tsan)" >&2; exit 64 ;;
  esac
done
[[ ${#passes[@]} -eq 0 ]] && passes=(asan tsan)

now() { date +%s; }
log() { echo "run_sanitizers: $*"; }
summary=()
failed=0

# A build tree that git ignores whatever the top-level .gitignore says.
make_build_dir() {
  mkdir -p "$1"
  [[ -f "$1/.gitignore" ]] || echo '*' >"$1/.gitignore"
}

# Prints the first report files of $1 (a folder of log_path files).
show_reports() {
  local dir=$1 file shown=0
  for file in "$dir"/*; do
    [[ -f "$file" ]] || continue
    if ((shown == 5)); then
      log "(more reports in $dir)"
      break
    fi
    echo "---- $file"
    head -n 60 "$file"
    shown=$((shown + 1))
  done
}

# The test tools' Python environments are cached beside the main build
# (make test makes them); reuse them rather than install them again. A
# link that goes stale is replaced by ensure_venv (tests/lib/venv.sh).
share_venvs() {
  local tests_dir=$1 venv
  mkdir -p "$tests_dir"
  for venv in pyvenv tritonvenv k8svenv monitoringvenv pyclientvenv; do
    if [[ -d "$repo/build/tests/$venv" && ! -e "$tests_dir/$venv" ]]; then
      ln -s "$repo/build/tests/$venv" "$tests_dir/$venv"
    fi
  done
}

cmake_common=(
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-Og -g1 -DNDEBUG"
  -DATTN_WITH_CUDA=OFF
  -DATTN_BUILD_BENCHMARKS=OFF
)

run_asan() {
  local start built tested reports dir=$asan_dir
  start=$(now)
  local reports_dir=$dir/sanitizer-reports
  make_build_dir "$dir"
  log "asan: configure and build in $dir"
  if ! cmake -S "$repo" -B "$dir" "${cmake_common[@]}" \
      "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
      "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" \
      "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" \
      >"$dir/configure.log" 2>&1 ||
     ! cmake --build "$dir" -j"$jobs" >"$dir/build.log" 2>&1; then
    tail -n 40 "$dir/configure.log" "$dir/build.log" 2>/dev/null
    summary+=("asan: BUILD FAILED (logs: $dir/configure.log, $dir/build.log)")
    failed=1
    return
  fi
  built=$(now)
  share_venvs "$dir/tests"
  rm -rf "$reports_dir"
  mkdir -p "$reports_dir"
  # Every report aborts its process (halt_on_error, no recovery) and is
  # also written to $reports_dir. Leaks: LeakSanitizer at exit (exit code
  # 23); attnserve ends with _Exit after its drain (server/main.cc), which
  # skips the exit-time leak check, so its leaks count only on the error
  # paths that return from main.
  local asan_options="detect_leaks=1:halt_on_error=1:abort_on_error=0"
  asan_options+=":detect_stack_use_after_return=1:check_initialization_order=1"
  asan_options+=":strict_init_order=1:log_path=$reports_dir/asan"
  log "asan: ctest -j$jobs (log: $dir/ctest.log)"
  # GTEST_FILTER reaches only the whole-binary runs, the instruction-set
  # variants (isa_*): each discovered test names its own --gtest_filter,
  # which wins. There the two long precision sweeps (~4 min each under
  # ASan, most of the pass) are left out: they run under ASan at this CPU's
  # own instruction set, and at every instruction set in `make test`.
  GTEST_FILTER='-AttentionPrecisionTest.FewRowsOverManyKeysAsLanes:AttentionPrecisionTest.KeySharesMergeToTheReference' \
  ASAN_OPTIONS=$asan_options \
  LSAN_OPTIONS="log_path=$reports_dir/lsan" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports_dir/ubsan" \
    ctest --test-dir "$dir" -j"$jobs" --output-on-failure -LE 'static|container|faults' \
      >"$dir/ctest.log" 2>&1
  local rc=$?
  tested=$(now)
  reports=$(find "$reports_dir" -type f | wc -l)
  local line
  line=$(grep -E '^[0-9]+% tests passed' "$dir/ctest.log" | tail -n 1)
  summary+=("asan: ${line:-no CTest summary}; $reports report file(s); build $((built - start)) s, tests $((tested - built)) s")
  if [[ $rc -ne 0 || $reports -ne 0 ]]; then
    failed=1
    sed -n '/The following tests FAILED/,$p' "$dir/ctest.log"
    [[ $rc -ne 0 ]] && log "asan: failing tests' output: $dir/ctest.log"
    show_reports "$reports_dir"
  fi
}

# Abseil's synchronisation sources, from Debian's source package of the
# installed libabsl-dev, compiled with -fsanitize=thread; prints the
# archive's path (messages go to stderr).
build_tsan_abseil() {
  local dir=$1 out=$1/abseil-tsan
  local version package
  version=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null) ||
    { log "tsan: libabsl-dev is not installed" >&2; return 1; }
  package=$(dpkg-query -W -f='${source:Package}' libabsl-dev)
  local archive=$out/libabsl_tsan.a
  # The stamp names the sources too: a build with a different set is redone.
  local stamp="$version: synchronization low_level_alloc status"
  if [[ -f $archive && "$(cat "$out/version" 2>/dev/null)" == "$stamp" ]]; then
    echo "$archive"
    return 0
  fi
  rm -rf "$out"
  mkdir -p "$out/apt/lists/partial" "$out/apt/cache/archives/partial" \
    "$out/apt/sources" "$out/src" "$out/obj"
  # deb-src lines for the mirrors the system already uses, in a private
  # apt state (lists and cache under $out/apt).
  local uris
  uris=$( { grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
              awk '{print $2}'
            grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
              2>/dev/null | grep -oE 'https?://[^ ]+' | head -n 1
          } | grep -E 'debian' | sort -u)
  [[ -n "$uris" ]] || uris=http://deb.debian.org/debian
  local codename
  # shellcheck disable=SC1091  # the system's, read at run time
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  local uri
  for uri in $uris; do
    local suites="$codename $codename-updates"
    [[ $uri == *security* ]] && suites="$codename-security"
    printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n' \
      "$uri" "$suites" >>"$out/apt/sources/src.sources"
  done
  local apt=(apt-get -q -o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$out/apt/sources"
    -o "Dir::State::Lists=$out/apt/lists" -o "Dir::Cache=$out/apt/cache"
    -o "APT::Sandbox::User=root")
  if ! "${apt[@]}" update >"$out/apt.log" 2>&1 ||
     ! (cd "$out/src" && "${apt[@]}" source --download-only \
          "$package=$version") >>"$out/apt.log" 2>&1; then
    tail -n 20 "$out/apt.log" >&2
    log "tsan: cannot fetch the source of $package $version from Debian's mirror" >&2
    return 1
  fi
  local tarball
  tarball=$(find "$out/src" -maxdepth 1 -name "${package}_*.orig.tar.*" | head -n 1)
  [[ -n "$tarball" ]] || { log "tsan: no orig tarball in $out/src" >&2; return 1; }
  tar -xf "$tarball" -C "$out/src" --wildcards \
    '*/absl/synchronization/*.cc' '*/absl/base/internal/low_level_alloc.cc' \
    '*/absl/status/status.cc' ||
    return 1
  local src=()
  local file
  while IFS= read -r file; do src+=("$file"); done < <(
    find "$out/src" -path '*/absl/*' -name '*.cc' \
      ! -name '*_test.cc' ! -name '*_benchmark.cc' ! -name '*_testing.cc' | sort)
  # Against the installed headers (-I/usr/include first: Debian's
  # options.h and inline namespace), never the tarball's.
  local objects=() i=0
  for file in "${src[@]}"; do
    objects+=("$out/obj/$i-$(basename "$file" .cc).o")
    g++ -std=c++17 -O1 -g1 -fPIC -fno-omit-frame-pointer -fsanitize=thread \
      -I/usr/include -c "$file" -o "${objects[-1]}" >>"$out/compile.log" 2>&1 &
    i=$((i + 1))
    if ((i % jobs == 0)); then wait; fi
  done
  wait
  local object
  for object in "${objects[@]}"; do
    [[ -f $object ]] || { cat "$out/compile.log" >&2; return 1; }
  done
  ar rcs "$archive" "${objects[@]}" || return 1
  echo "$stamp" >"$out/version"
  echo "$archive"
}

# Proves the set-up before trusting its silence: with the instrumented
# Abseil linked as the tests link it, a counter bumped from two threads
# under an absl::Mutex is not reported, nor an error status copied on one
# thread and released last on another (ordered only by its own reference
# count: the flag between them is relaxed, no synchronisation), and a
# counter bumped without the mutex is.
tsan_canary() {
  local dir=$1/canary abseil=$2 absl_libs=$3 tsan_options=$4
  mkdir -p "$dir"
  cat >"$dir/canary.cc" <<'CANARY'
#include <atomic>
#include <thread>
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
absl::Mutex mu;
long guarded = 0, unguarded = 0;
absl::Status handed ABSL_GUARDED_BY(mu);
std::atomic<bool> released{false};
void Bump(bool race) {
  for (int i = 0; i < 1000; ++i) {
    { absl::MutexLock lock(&mu); ++guarded; }
    if (race) ++unguarded;
  }
}
// The other thread hands a copy over, waits (relaxed) until this one has
// copied and dropped it, then drops the last reference: the rep's delete.
void DropLast() {
  const absl::Status mine = absl::InternalError("canary");
  { absl::MutexLock lock(&mu); handed = mine; }
  while (!released.load(std::memory_order_relaxed)) std::this_thread::yield();
}
bool CopyAndRelease() {
  absl::Status copy;
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](absl::Status* s) { return !s->ok(); }, &handed));
    copy = handed;  // the increment, inline
    handed = absl::OkStatus();
  }
  const bool seen = copy.code() == absl::StatusCode::kInternal;
  copy = absl::OkStatus();
  released.store(true, std::memory_order_relaxed);
  return seen;
}
int main(int argc, char**) {
  std::thread other(Bump, argc > 1);
  Bump(argc > 1);
  other.join();
  std::thread dropper(DropLast);
  const bool seen = CopyAndRelease();
  dropper.join();
  return guarded == 2000 && seen ? 0 : 1;
}
CANARY
  # shellcheck disable=SC2086  # absl_libs: separate words
  g++ -std=c++17 -O1 -g1 -fsanitize=thread "$dir/canary.cc" -o "$dir/canary" \
    -Wl,--whole-archive "$abseil" -Wl,--no-whole-archive $absl_libs \
    >"$dir/build.log" 2>&1 || { cat "$dir/build.log"; return 1; }
  TSAN_OPTIONS=$tsan_options "$dir/canary" >"$dir/clean.log" 2>&1 ||
    { log "tsan: canary: absl::Mutex or absl::Status is not visible to TSan:"; head -n 40 "$dir/clean.log"; return 1; }
  TSAN_OPTIONS=$tsan_options "$dir/canary" race >"$dir/race.log" 2>&1
  grep -q '^WARNING: ThreadSanitizer: data race' "$dir/race.log" ||
    { log "tsan: canary: TSan missed a plain data race"; return 1; }
}

run_tsan() {
  local start built tested dir=$tsan_dir
  start=$(now)
  make_build_dir "$dir"
  log "tsan: Abseil's synchronisation with -fsanitize=thread, configure and build in $dir"
  local abseil
  if ! abseil=$(build_tsan_abseil "$dir"); then
    summary+=("tsan: FAILED to build Abseil's synchronisation for TSan (see above)")
    failed=1
    return
  fi
  # The instrumented Abseil objects come first, whole: they interpose on the
  # shared libraries' copies. The shared Abseil libraries they call into
  # follow them (also for CMake's own try-compile programs).
  local absl_libs="-labsl_synchronization -labsl_graphcycles_internal"
  absl_libs+=" -labsl_malloc_internal -labsl_base -labsl_spinlock_wait"
  absl_libs+=" -labsl_raw_logging_internal -labsl_stacktrace -labsl_symbolize"
  absl_libs+=" -labsl_debugging_internal -labsl_demangle_internal"
  absl_libs+=" -labsl_time -labsl_time_zone -labsl_int128"
  absl_libs+=" -labsl_status -labsl_cord -labsl_cordz_info -labsl_strerror"
  absl_libs+=" -labsl_strings"
  local targets=(batcher_test worker_pool_test admission_test
    call_runner_test mapped_file_test sanitizer_concurrency_test
    residency_test)
  # The archive is not a dependency CMake knows of: relink after it changed.
  local target
  for target in "${targets[@]}"; do
    find "$dir" -type f -name "$target" ! -newer "$abseil" -delete
  done
  if ! cmake -S "$repo" -B "$dir" "${cmake_common[@]}" \
      "-DCMAKE_CXX_FLAGS=-fsanitize=thread -fno-omit-frame-pointer" \
      "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -Wl,--whole-archive $abseil -Wl,--no-whole-archive $absl_libs" \
      "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread" \
      >"$dir/configure.log" 2>&1 ||
     ! cmake --build "$dir" -j"$jobs" --target "${targets[@]}" \
      >"$dir/build.log" 2>&1; then
    tail -n 40 "$dir/configure.log" "$dir/build.log" 2>/dev/null
    summary+=("tsan: BUILD FAILED (logs: $dir/configure.log, $dir/build.log)")
    failed=1
    return
  fi
  built=$(now)
  # Each binary runs once, all of its tests in one process (CTest would
  # start one process per test, each paying TSan's start-up, and it sets
  # OMP_NUM_THREADS=2). Reports do not stop the run: all are counted, and
  # any makes the process exit 66.
  local tsan_options="halt_on_error=0:exitcode=66:second_deadlock_stack=1"
  tsan_options+=":suppressions=$here/tsan.supp:print_suppressions=0"
  if ! tsan_canary "$dir" "$abseil" "$absl_libs" "$tsan_options"; then
    summary+=("tsan: FAILED: the canary (see above; $dir/canary)")
    failed=1
    return
  fi
  local binary rc reports total_reports=0 tests total_tests=0 bad=()
  for target in "${targets[@]}"; do
    binary=$(find "$dir" -type f -name "$target" -perm -u+x | head -n 1)
    if [[ -z "$binary" ]]; then
      bad+=("$target (not built)")
      continue
    fi
    OMP_NUM_THREADS=1 TSAN_OPTIONS=$tsan_options \
      "$binary" --gtest_brief=1 >"$dir/$target.log" 2>&1
    rc=$?
    reports=$(grep -c '^WARNING: ThreadSanitizer' "$dir/$target.log")
    tests=$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from.*ran.*/\1/p' \
      "$dir/$target.log" | tail -n 1)
    total_tests=$((total_tests + ${tests:-0}))
    total_reports=$((total_reports + reports))
    if [[ $rc -ne 0 || $reports -ne 0 ]]; then
      bad+=("$target (exit $rc, $reports report(s); log $dir/$target.log)")
      grep -E '^\[  FAILED  \]' "$dir/$target.log" | head -n 20
      if ((reports > 0)); then
        awk '/^WARNING: ThreadSanitizer/{n++} n>0 && n<=3' "$dir/$target.log" |
          head -n 120
      fi
    fi
  done
  tested=$(now)
  summary+=("tsan: $total_tests tests in ${#targets[@]} binaries, $total_reports report(s); build $((built - start)) s, tests $((tested - built)) s")
  if [[ ${#bad[@]} -ne 0 ]]; then
    failed=1
    summary+=("tsan: FAILED: ${bad[*]}")
  fi
}

overall=$(now)
for pass in "${passes[@]}"; do
  "run_$pass"
done
echo
log "summary"
for line in "${summary[@]}"; do echo "  $line"; done
echo "  total $(( $(now) - overall )) s"
if [[ $failed -ne 0 ]]; then
  log "FAILED"
  exit 1
fi
log "all clean"

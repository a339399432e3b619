#!/usr/bin/env bash
# Triton's own load tester, perf_analyzer, against attnserve's KServe API:
# dot_product_attention at the textbook's toy shape and at the medium shape,
# batching off and on, over gRPC unary ModelInfer and streaming
# ModelStreamInfer (perf_analyzer --streaming: one stream per concurrent
# client) and over HTTP/REST with binary tensors (`http`, perf_analyzer's
# default) or JSON tensors (`http-json`), over a concurrency range. Prints
# perf_analyzer's CSV rows as one markdown table.
# Not part of the test suite.
#
# PyPI's perf-analyzer wheels need glibc 2.38 and Debian 12 has 2.36, so the
# script runs the binary in a Debian 13 (trixie) chroot made with
# debootstrap from Debian's mirror (root; once, cached in $CHROOT).
#
# Besides perf_analyzer's throughput and latency, each row has the server's
# own CPU time per inference (user + system, from /proc, over the requests
# its metrics counted): with client and server on the same two cores,
# perf_analyzer itself can be the bottleneck (it took 167% of the 2 cores
# against the server's 40% at toy size), and then the server's cost per
# inference is what tells the APIs apart.
#
# PA_STABILITY (default 30, percent) and PA_MAX_TRIALS (default 6) are
# perf_analyzer's --stability-percentage and --max-trials: at 64 in flight
# over HTTP its windows vary more than 30% (the server pinned to one core),
# and it then reports nothing although it ran ~20k requests a second.
#
# Each measurement window is a count of requests (count_windows): with
# time windows, perf_analyzer 2.60 grew by ~500 MB a second on the medium
# case and was OOM-killed at 24 GB. Its address space is capped as well.
#
# Usage: bench/perf_analyzer.sh [CONCURRENCY_RANGE [APIS [BATCHING]]]
#   defaults: 16:64:16, "unary streaming", "off on"; APIS from
#   "unary streaming http http-json"
# Where glibc is 2.38 or newer (the GPU machines), PERF_ANALYZER=path runs
# that binary directly, no chroot; ATTNSERVE=path picks the server binary
# and ATTNSERVE_FLAGS adds server flags (deploy/device/run_gpu_checks.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
range="${1:-16:64:16}"
apis="${2:-unary streaming}"
batching_modes="${3:-off on}"
chroot_dir="${CHROOT:-/var/tmp/attnserve-trixie}"
server=${ATTNSERVE:-build/server/attnserve}
[[ -x "$server" ]] || { echo "build first: make build" >&2; exit 1; }
if [[ -n "${PERF_ANALYZER:-}" ]]; then
  # Direct: the input data and CSVs in a temporary folder.
  data=$(mktemp -d -t attnserve-pa.XXXXXX)
  data_seen=$data
  perf_analyzer=("$PERF_ANALYZER")
else
  # In the chroot: files in its /tmp.
  bash bench/perf_analyzer_chroot.sh "$chroot_dir"
  data=$chroot_dir/tmp
  data_seen=/tmp
  perf_analyzer=(chroot "$chroot_dir" /opt/perf_analyzer/bin/perf_analyzer)
fi

# Input data: per batch item, without the batch dimension.
python3 bench/serving_peers/peers.py data "$data"

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pid=""
trap '[[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null' EXIT
# The server's CPU seconds (user + system) and the requests it counted.
server_cpu() { awk '{printf "%.6f", ($14 + $15) / '"$(getconf CLK_TCK)"'}' "/proc/$pid/stat"; }
server_requests() {
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
    "http://127.0.0.1:$metrics_port/metrics" |
    awk '/^attnserve_requests_total/ {n += $NF} END {printf "%d", n}'
}
echo "| case | API | batching | concurrency | infer/s | p50 ms | p99 ms | server CPU µs / infer |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
for mode in $batching_modes; do
  grpc_port=$(port)
  metrics_port=$(port)
  http_port=$(port)
  # shellcheck disable=SC2086  # ATTNSERVE_FLAGS is a flag list
  "$server" --host=127.0.0.1 --grpc_port="$grpc_port" --metrics_port="$metrics_port" \
    --http_port="$http_port" \
    --drain_notice_ms=0 "--batching=$([[ $mode == on ]] && echo true || echo false)" \
    ${ATTNSERVE_FLAGS:-} >/dev/null 2>&1 &
  pid=$!
  sleep 2
  for case in toy medium; do
    requests_per_window=20000
    [[ $case == medium ]] && requests_per_window=4000
    for api in $apis; do
      protocol=(-i grpc -u "127.0.0.1:$grpc_port")
      case $api in
        streaming) protocol+=(--streaming) ;;
        http) protocol=(-i http -u "127.0.0.1:$http_port") ;;
        http-json) protocol=(-i http -u "127.0.0.1:$http_port"
                             --input-tensor-format=json --output-tensor-format=json) ;;
      esac
      cpu_before=$(server_cpu)
      requests_before=$(server_requests)
      # A memory cap: perf_analyzer once grew to 24 GB on the medium case and
      # was OOM-killed, taking the machine with it; now it fails alone
      # (PA_MEMORY_CAP_GIB, default 12: at that cap its medium unary run
      # sometimes aborts, so larger machines raise it).
      # And a time limit: with --streaming and batching on, perf_analyzer
      # twice sat idle for minutes (0 s of CPU; the server had answered
      # everything it was sent) right after a unary run on the same server,
      # and ran normally when retried.
      timeout 300 prlimit --as=$((${PA_MEMORY_CAP_GIB:-12} << 30)) -- \
      "${perf_analyzer[@]}" -m dot_product_attention \
        "${protocol[@]}" --input-data "$data_seen/$case.json" \
        --concurrency-range "$range" --measurement-mode count_windows \
        --measurement-request-count "$requests_per_window" -f "$data_seen/$case.csv" \
        --max-trials="${PA_MAX_TRIALS:-6}" --stability-percentage="${PA_STABILITY:-30}" \
        >/dev/null 2>&1 || { echo "perf_analyzer failed for $case ($api, $mode)" >&2; continue; }
      cpu_after=$(server_cpu)
      requests_after=$(server_requests)
      python3 - "$data/$case.csv" "$case" "$api" "$mode" \
        "$cpu_before" "$cpu_after" "$requests_before" "$requests_after" <<'PY'
import csv, sys
case, api, mode = sys.argv[2:5]
cpu = float(sys.argv[6]) - float(sys.argv[5])
requests = int(sys.argv[8]) - int(sys.argv[7])
# Over the whole perf_analyzer run (every trial and concurrency).
per_infer = f"{1e6 * cpu / requests:.0f}" if requests > 0 else "-"
for row in csv.DictReader(open(sys.argv[1])):
    print(f"| {case} | {api} | {mode} | {row['Concurrency']} | "
          f"{float(row['Inferences/Second']):.0f} | {int(row['p50 latency']) / 1e3:.2f} | "
          f"{int(row['p99 latency']) / 1e3:.2f} | {per_infer} |")
PY
    done
  done
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
done

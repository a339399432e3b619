#!/usr/bin/env bash
# What loading a large stored memory costs: writes one attention memory of
# N key-value pairs (d = v = 64, float32: N = 1,048,576 is a 512 MiB file),
# then starts attnserve over it with the weights mapped (the default) and
# read (--map_model_weights=false), each from a cold page cache (the file's
# pages dropped with posix_fadvise) and a warm one. Prints per start the
# seconds until health answers, the resident memory after (VmRSS, split into
# the process's own pages, RssAnon, and file pages, RssFile) and the peak
# (VmHWM); then two replicas side by side on the one file, with each one's
# proportional share (Pss, which splits shared pages between the processes
# that map them) and own pages. Not part of the test suite (about a
# minute).
#
# Usage: bench/memory_load_bench.sh [N]   (default 1048576; build first)
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
n="${1:-1048576}"
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
out=$(mktemp -d -t attnserve-load.XXXXXX)
pid=""
pids=()
cleanup() {
  for p in $pid "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT
python3 bench/write_memories.py "$out/models" memory "$n"
weights="$out/models/memory_$n/weights.safetensors"

# shellcheck source=bench/serve.sh
source bench/serve.sh

drop_cache() {
  sync
  python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$weights"
}
status_mib() {  # pid field
  awk -v f="$2:" '$1 == f { printf "%.0f", $2 / 1024 }' "/proc/$1/status"
}
pss_mib() {  # pid
  awk '$1 == "Pss:" { printf "%.0f", $2 / 1024 }' "/proc/$1/smaps_rollup"
}

echo "| weights | page cache | ready (s) | VmRSS MiB | RssAnon | RssFile | peak (VmHWM) |"
echo "|---|---|---:|---:|---:|---:|---:|"
for mode in mapped read; do
  map=$([[ $mode == mapped ]] && echo true || echo false)
  for cache in cold warm; do
    [[ $cache == cold ]] && drop_cache
    start=$EPOCHREALTIME
    START_TRIES=3000 START_POLL=0.01 start_server --http_port=0 \
      --model_repository="$out/models" --map_model_weights="$map"
    ready=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')
    printf "| %s | %s | %.2f | %s | %s | %s | %s |\n" "$mode" "$cache" "$ready" \
      "$(status_mib "$pid" VmRSS)" "$(status_mib "$pid" RssAnon)" \
      "$(status_mib "$pid" RssFile)" "$(status_mib "$pid" VmHWM)"
    stop_server
  done
done

echo
echo "Two replicas on the one file (warm cache):"
echo "| weights | replica | Pss MiB | RssAnon MiB |"
echo "|---|---|---:|---:|"
for mode in mapped read; do
  map=$([[ $mode == mapped ]] && echo true || echo false)
  pids=()
  for replica in 1 2; do
    START_TRIES=3000 start_server --http_port=0 \
      --model_repository="$out/models" --map_model_weights="$map"
    pids+=("$pid")
    pid=""
  done
  for replica in 1 2; do
    p=${pids[$((replica - 1))]}
    printf "| %s | %s | %s | %s |\n" "$mode" "$replica" "$(pss_mib "$p")" \
      "$(status_mib "$p" RssAnon)"
  done
  for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p" || true; done
  pids=()
done

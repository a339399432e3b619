#!/usr/bin/env bash
# The numbers that say whether server-side batching pays: starts attnserve
# (batching off, then on) on free loopback ports, drives it with
# `attnctl load` at 64 requests in flight, and prints one table. Not part of
# the test suite (it takes a few minutes).
#
# Usage: bench/batching_bench.sh [DURATION]    (default 10s per row; build first)
# Extra server flags for both runs: ATTNSERVE_FLAGS='--max_queue_delay_us=300'
# The medium case's batch: MEDIUM_BATCH=32 (default 1).
# Other binaries (the GPU bundle's): ATTNSERVE=path ATTNCTL=path; the GPU's
# name for the table: ATTN_GPU_NAME (deploy/device/run_gpu_checks.sh sets
# all three).
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
duration="${1:-10s}"
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
out=$(mktemp -d -t attnserve-batching.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; [[ -n "${KEEP:-}" ]] || rm -rf "$out"; }
trap cleanup EXIT

# shellcheck source=bench/serve.sh
source bench/serve.sh

scrape() {  # the metrics, with curl or, on machines without it, Python
  local url="http://127.0.0.1:$metrics_port/metrics"
  if command -v curl >/dev/null; then
    curl -fsS "$url" >"$out/$1.prom"
  else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$url" >"$out/$1.prom"
  fi
}

load() {  # name, attnctl load flags...
  local name=$1
  shift
  echo "  $name" >&2
  scrape "$name.before"
  "$ctl" --target="127.0.0.1:$grpc_port" --deadline=10s load \
    --concurrency=64 --duration="$duration" --warmup=2s \
    --output_format=json "$@" >"$out/$name.json"
  scrape "$name.after"
}

# The smallest call through the serving core: against health (no core),
# what decoding, the core and encoding add to a trivial call.
trivial="--rpc=masked-softmax --shape=x=1x1x1"
toy="--rpc=attention --shape=queries=1x1x2,keys=1x10x2,values=1x10x4"
# MEDIUM_BATCH: the medium request's batch (1; the GPU issue asks for 32).
mb=${MEDIUM_BATCH:-1}
medium="--rpc=attention --shape=queries=${mb}x64x64,keys=${mb}x64x64,values=${mb}x64x64 --valid_lens_range=1:64"
ragged="--rpc=attention --shape=queries=1x64x64,keys=1x64x64,values=1x64x64 --lk_range=16:128"
for mode in off on; do
  echo "batching $mode:" >&2
  start_server "--batching=$([[ $mode == on ]] && echo true || echo false)"
  # shellcheck disable=SC2086
  {
    load "health_$mode" --rpc=health
    load "trivial_$mode" $trivial
    load "toy_$mode" $toy
    load "medium_$mode" $medium
    load "ragged_$mode" $ragged
  }
  stop_server
done
max_delay_us=$(grep -o -- "--max_queue_delay_us=[0-9]*" <<<"${ATTNSERVE_FLAGS:-}" | cut -d= -f2 || true)
python3 bench/batching_table.py "$out" "${max_delay_us:-500}"

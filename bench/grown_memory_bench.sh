#!/usr/bin/env bash
# Queries over a memory grown by appends against the same size in one piece
# (issue #47's goal): a memory of N key-value pairs (default 1,048,576,
# d = v = 64, float32) uploaded whole (mapped from its one file), and one
# grown from nothing by appends of ROWS rows (default 1,024) through
# `attnctl load --rpc append`, then single-query calls (queries 1x1x64) at
# 64 in flight against each with `attnctl load`. Prints throughput and p99
# of both, their ratio, and how long the appends took. Not part of the
# test suite (a minute or two).
#
# Usage: bench/grown_memory_bench.sh [DURATION] [N]   (default 10s, 1048576)
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
duration="${1:-10s}"
n="${2:-1048576}"
rows=${ROWS:-1024}
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
(( n % rows == 0 )) || { echo "N must be a multiple of ROWS ($rows)" >&2; exit 64; }
out=$(mktemp -d -t attnserve-grown.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; [[ -n "${KEEP:-}" ]] || rm -rf "$out"; }
trap cleanup EXIT

python3 bench/write_memories.py "$out/models" memory "$n"
# shellcheck source=bench/serve.sh
source bench/serve.sh
START_TRIES=600 start_server --http_port=0 --model_repository="$out/models"
ctl() { "$ctl" --target="127.0.0.1:$grpc_port" --deadline=60s "$@"; }

echo "growing 'grown' by $((n / rows)) appends of $rows rows" >&2
start=$(date +%s.%N)
ctl load --rpc=append --memory_name=grown --create \
  --shape="keys=${rows}x64,values=${rows}x64" --encoding=raw \
  --concurrency=1 --requests=$((n / rows)) --warmup=0s --pool_size=4 \
  --output_format=json >"$out/appends.json"
end=$(date +%s.%N)
for memory in "memory_$n" grown; do
  echo "queries on $memory" >&2
  ctl load --rpc=attention --memory_name="$memory" --shape=queries=1x1x64 \
    --concurrency=64 --duration="$duration" --warmup=2s \
    --output_format=json >"$out/$memory.json"
done
files=$(find "$out/models/grown" -name 'rows-*' | wc -l)
stop_server

python3 - "$out" "$n" "$rows" "$start" "$end" "$files" <<'PY'
import json, os, sys
out, n, rows, start, end, files = sys.argv[1:]
def load(name):
    with open(os.path.join(out, name + ".json")) as f:
        return json.load(f)
whole, grown, appends = load("memory_" + n), load("grown"), load("appends")
print("memory %s rows, d = v = 64, F32; grown by %d appends of %s rows in "
      "%.1f s (append p50 %.1f ms, p99 %.1f ms), %s rows files + the first" % (
          n, appends["ok"] + 0, rows, float(end) - float(start),
          appends["latency_ms"]["p50"], appends["latency_ms"]["p99"], files))
print("| memory | req/s | p99 ms |")
print("|---|---:|---:|")
for label, r in (("one piece, uploaded whole", whole), ("grown by appends", grown)):
    print("| %s | %.0f | %.1f |" % (label, r["throughput_rps"], r["latency_ms"]["p99"]))
print("grown / one piece: %.2fx" % (grown["throughput_rps"] / whole["throughput_rps"]))
PY

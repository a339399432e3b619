#!/usr/bin/env bash
# Appends under load (issue #47's goal): a memory of N key-value pairs
# (default 1,048,576, d = v = 64, float32) written into a fresh repository,
# attnserve over it with its defaults, and single-query calls (queries
# 1x1x64, memory_name) at 64 in flight with `attnctl load`, first with the
# memory left alone, then while a second `attnctl load --rpc append` appends
# ROWS rows (default 1,024) RATE times a second (default 20, open loop).
# Prints the query throughput and p99 both ways, their ratio, and the
# appends' latency (each acknowledged durable: fsynced before its answer).
# The memory grows while the queries run (by ~40% in 20 s at the defaults),
# and each query attends to every row: so it also prints the ratio of rows
# attended per second (queries/s x the memory's mean rows over the measured
# window, from attnserve_model_rows at its start and end), which holds the
# work per query equal.
# APPEND_TO=other: the appends go to a second memory of 4,096 rows instead,
# so the queried one does not grow: what the appends' writes and fsyncs
# cost the queries alone.
# Both are measured after a 5 s warm-up: the first append after a load
# copies the memory out of its mapped file once (~1 s for 512 MiB under
# this load), and the appends behind it wait; the server's
# attnserve_model_append_seconds shows it.
# Not part of the test suite (a minute).
#
# Usage: bench/append_bench.sh [DURATION] [N]   (default 20s, 1048576)
#   ROWS=1024 RATE=20: the appends' size and rate.
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
duration="${1:-20s}"
n="${2:-1048576}"
rows=${ROWS:-1024}
rate=${RATE:-20}
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
out=$(mktemp -d -t attnserve-append.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; [[ -n "${KEEP:-}" ]] || rm -rf "$out"; }
trap cleanup EXIT

python3 bench/write_memories.py "$out/models" memory "$n" 4096
target="memory_$n"
[[ "${APPEND_TO:-}" == other ]] && target=memory_4096
# shellcheck source=bench/serve.sh
source bench/serve.sh
START_TRIES=600 start_server --http_port=0 --model_repository="$out/models"

rows_now() {  # the queried memory's rows, from the metrics
  python3 -c 'import sys, urllib.request
for line in urllib.request.urlopen(sys.argv[1]).read().decode().splitlines():
    if line.startswith("attnserve_model_rows{") and "\"%s\"" % sys.argv[2] in line:
        print(int(float(line.split()[-1])))' \
    "http://127.0.0.1:$metrics_port/metrics" "memory_$n"
}

queries() {  # queries LABEL: 64 in flight for $duration
  "$ctl" --target="127.0.0.1:$grpc_port" --deadline=30s load --rpc=attention \
    --memory_name="memory_$n" --shape=queries=1x1x64 --concurrency=64 \
    --duration="$duration" --warmup=5s --output_format=json >"$out/$1.json"
}
echo "queries, the memory alone" >&2
queries alone
echo "queries while $rate appends/s of $rows rows run" >&2
"$ctl" --target="127.0.0.1:$grpc_port" --deadline=30s load --rpc=append \
  --memory_name="$target" --shape="keys=${rows}x64,values=${rows}x64" --encoding=raw \
  --rate="$rate" --duration="$duration" --warmup=5s --pool_size=4 \
  --output_format=json >"$out/appends.json" &
appender=$!
(sleep 5; rows_now >"$out/rows_start") &
queries appending
rows_now >"$out/rows_end"
wait "$appender"
stop_server

python3 - "$out" "$n" "$rows" "$rate" "$target" <<'PY'
import json, os, sys
out, n, rows, rate, target = sys.argv[1:]
def load(name):
    with open(os.path.join(out, name + ".json")) as f:
        return json.load(f)
alone, busy, appends = load("alone"), load("appending"), load("appends")
print("memory %s rows, d = v = 64, F32; appends of %s rows at %s/s to %s" % (
    n, rows, rate, "it" if target == "memory_" + n else target))
print("| queries | req/s | p99 ms |")
print("|---|---:|---:|")
for label, r in (("memory alone", alone), ("while appending", busy)):
    print("| %s | %.0f | %.1f |" % (label, r["throughput_rps"], r["latency_ms"]["p99"]))
print("throughput while appending / alone: %.2fx" % (
    busy["throughput_rps"] / alone["throughput_rps"]))
with open(os.path.join(out, "rows_start")) as f, open(os.path.join(out, "rows_end")) as g:
    start, end = int(f.read()), int(g.read())
mean = (start + end) / 2
print("rows over the measured window: %d -> %d, mean %.2fx the memory alone's" % (
    start, end, mean / int(n)))
print("rows attended per second while appending / alone: %.2fx" % (
    busy["throughput_rps"] * mean / (alone["throughput_rps"] * int(n))))
lat = appends["latency_ms"]
print("appends: %d OK of %d sent, %.1f/s; latency p50 %.1f ms, p99 %.1f ms, max %.1f ms" % (
    appends["ok"], appends["requests"], appends.get("achieved_rate_rps", 0),
    lat["p50"], lat["p99"], lat["max"]))
PY

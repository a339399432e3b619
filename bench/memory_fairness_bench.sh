#!/usr/bin/env bash
# Whether several stored memories are served fairly: writes three attention
# memories (float32, d = v = 64, a little over N entries each so that they
# differ), starts attnserve over them with the server's defaults (their
# batches one at a time on the wide engine), and queries all three at once at
# unequal load with `attnctl load` (single-query calls; by default 48 in
# flight on the first, 8 on each of the others); prints each memory's
# throughput and latency percentiles, and each lightly loaded memory's p90
# and p99 against the busy one's (attnctl load reports p50, p90, p99; the
# goal, a light memory's p95 within 2x of the busy one's, lies between).
# Not part of the test suite.
#
# Usage: bench/memory_fairness_bench.sh [DURATION] [N] [BUSY LIGHT]
#   (default 10s, 65536, 48 8; build first)
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
duration="${1:-10s}"
n="${2:-65536}"
busy="${3:-48}"
light="${4:-8}"
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
out=$(mktemp -d -t attnserve-fairness.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; rm -rf "$out"; }
trap cleanup EXIT
sizes=("$n" "$((n + 64))" "$((n + 128))")
python3 bench/write_memories.py "$out/models" memory "${sizes[@]}"

# shellcheck source=bench/serve.sh
source bench/serve.sh
START_TRIES=600 start_server --http_port=0 --model_repository="$out/models"
loads=()
for i in 0 1 2; do
  concurrency=$([[ $i == 0 ]] && echo "$busy" || echo "$light")
  "$ctl" --target="127.0.0.1:$grpc_port" --deadline=30s load --rpc=attention \
    --memory_name="memory_${sizes[$i]}" --shape=queries=1x1x64 \
    --concurrency="$concurrency" --duration="$duration" --warmup=2s \
    --output_format=json >"$out/$i.json" &
  loads+=($!)
done
for load in "${loads[@]}"; do wait "$load"; done
stop_server

python3 - "$out" "$busy" "$light" "${sizes[@]}" <<'PY'
import json, os, sys
out, busy, light, sizes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = [json.load(open(os.path.join(out, "%d.json" % i))) for i in range(3)]
print("| memory | in flight | req/s | p50 ms | p90 ms | p99 ms | p90 / busy's | p99 / busy's |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
busy_p90, busy_p99 = rows[0]["latency_ms"]["p90"], rows[0]["latency_ms"]["p99"]
for i, r in enumerate(rows):
    lat = r["latency_ms"]
    print("| memory_%s | %s | %.0f | %.1f | %.1f | %.1f | %.2fx | %.2fx |" % (
        sizes[i], busy if i == 0 else light, r["throughput_rps"], lat["p50"],
        lat["p90"], lat["p99"], lat["p90"] / busy_p90, lat["p99"] / busy_p99))
PY

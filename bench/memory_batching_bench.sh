#!/usr/bin/env bash
# Whether batching pays against a stored memory (backend attention_memory):
# writes memories of N key-value pairs (d = v = 64, float32) into a fresh
# model repository, starts attnserve (batching off, then on) over it, and
# drives single-query requests (queries 1x1x64, memory_name) at 64 in flight
# with `attnctl load`; prints one row per N: throughput and p99 with batching
# off (--batch_stored_memories=false) and on (the server's defaults, which
# batch the calls on stored memories), and their ratio. Not part of the test
# suite (minutes).
#
# Usage: bench/memory_batching_bench.sh [DURATION] [N...]
#   (default 5s per row; N: 4096 65536 262144 1048576; build first)
# Extra server flags for both runs: ATTNSERVE_FLAGS='--max_queue_delay_us=300'
# KIND=memory16: the memories stored as BF16 (computed in bfloat16).
# KIND=regression: fitted Nadaraya-Watson models holding a 1-D training set
# of N points instead (x_query 1 point a call, --model_name); their calls
# run alone under the defaults, so "on" is --batching there.
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
duration="${1:-5s}"
shift || true
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(4096 65536 262144 1048576)
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
out=$(mktemp -d -t attnserve-memory.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; [[ -n "${KEEP:-}" ]] || rm -rf "$out"; }
trap cleanup EXIT

kind=${KIND:-memory}
[[ $kind == memory || $kind == memory16 || $kind == regression ]] ||
  { echo "KIND must be memory, memory16 or regression" >&2; exit 64; }
python3 bench/write_memories.py "$out/models" "$kind" "${sizes[@]}"

# shellcheck source=bench/serve.sh
source bench/serve.sh

for mode in off on; do
  echo "batching $mode:" >&2
  if [[ $kind != regression ]]; then
    batching="--batch_stored_memories=$([[ $mode == on ]] && echo true || echo false)"
  else
    batching="--batching=$([[ $mode == on ]] && echo true || echo false)"
  fi
  START_TRIES=600 start_server --http_port=0 --model_repository="$out/models" \
    "$batching"
  for n in "${sizes[@]}"; do
    echo "  N = $n" >&2
    if [[ $kind != regression ]]; then
      call=(--rpc=attention --memory_name="${kind}_$n" --shape=queries=1x1x64)
    else
      call=(--rpc=nadaraya-watson --model_name="regression_$n" --shape=x_query=1)
    fi
    "$ctl" --target="127.0.0.1:$grpc_port" --deadline=30s load "${call[@]}" \
      --concurrency=64 --duration="$duration" --warmup=2s \
      --output_format=json >"$out/${n}_$mode.json"
  done
  stop_server
done

python3 - "$out" "${sizes[@]}" <<'PY'
import json, os, sys
out, sizes = sys.argv[1], sys.argv[2:]
def row(n, mode):
    with open(os.path.join(out, "%s_%s.json" % (n, mode))) as f:
        return json.load(f)
print("| N | off: req/s | off: p99 ms | on: req/s | on: p99 ms | on / off |")
print("|---:|---:|---:|---:|---:|---:|")
for n in sizes:
    off, on = row(n, "off"), row(n, "on")
    rate = lambda r: r["throughput_rps"]
    p99 = lambda r: r["latency_ms"]["p99"]
    print("| %s | %.0f | %.1f | %.0f | %.1f | %.1fx |" % (
        n, rate(off), p99(off), rate(on), p99(on), rate(on) / rate(off)))
PY

#!/usr/bin/env bash
# Stored memories served from the GPU beside the same machine's CPU: writes
# attention memories of N key-value pairs (d = v = 64), float32 and bfloat16
# (BF16 ones compute in bfloat16), starts attnserve once per backend with
# its defaults (calls on stored memories batched), and drives single-query
# requests (queries 1x1x64, memory_name) at each concurrency with
# `attnctl load`. Prints one row per (backend, N, dtype, in flight):
# throughput and p50/p99 latency, and the server's calls by backend (from
# /metrics: how many ran on the GPU). Not part of the test suite (minutes).
#
# Usage: bench/memory_device_bench.sh [DURATION] [N...]
#   (default 4s per row; N: 65536 262144 1048576; build first)
# BACKENDS (default "cuda cpu"), KINDS ("memory memory16"), CONCURRENCY
# ("64 256"), CPU_SIZES (the sizes the cpu backend runs; default all),
# CLIENT_THREADS (attnctl's, default 4), ATTNSERVE_FLAGS (both servers).
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
duration="${1:-4s}"
shift || true
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(65536 262144 1048576)
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
out=$(mktemp -d -t attnserve-device.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; [[ -n "${KEEP:-}" ]] || rm -rf "$out"; }
trap cleanup EXIT
read -r -a backends <<<"${BACKENDS:-cuda cpu}"
read -r -a kinds <<<"${KINDS:-memory memory16}"
read -r -a concurrency <<<"${CONCURRENCY:-64 256}"
read -r -a cpu_sizes <<<"${CPU_SIZES:-${sizes[*]}}"
for kind in "${kinds[@]}"; do
  python3 bench/write_memories.py "$out/models" "$kind" "${sizes[@]}"
done

# shellcheck source=bench/serve.sh
source bench/serve.sh

runs_by_backend() {  # model: "cuda=N onednn-cpu=M" from /metrics
  python3 -c '
import re, sys, urllib.request
model, port = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port).read().decode()
runs = {}
for line in text.splitlines():
    m = re.match(r"attnserve_model_kernel_runs_total\{(.*)\} (\S+)", line)
    if not m: continue
    labels = dict(re.findall(r"(\w+)=\"([^\"]*)\"", m.group(1)))
    if labels.get("model") == model:
        runs[labels["backend"]] = int(float(m.group(2)))
print(" ".join("%s=%d" % kv for kv in sorted(runs.items())) or "-")' "$1" "$metrics_port"
}

echo "| backend | N | dtype | in flight | req/s | p50 ms | p99 ms | calls by backend |"
echo "|---|---:|---|---:|---:|---:|---:|---|"
for backend in "${backends[@]}"; do
  START_TRIES=1200 start_server --http_port=0 --model_repository="$out/models" \
    --backend="$backend"
  run_sizes=("${sizes[@]}")
  [[ $backend == cpu ]] && run_sizes=("${cpu_sizes[@]}")
  for n in "${run_sizes[@]}"; do
    for kind in "${kinds[@]}"; do
      for c in "${concurrency[@]}"; do
        result="$out/${backend}_${kind}_${n}_$c.json"
        "$ctl" --target="127.0.0.1:$grpc_port" --deadline=30s load \
          --rpc=attention --memory_name="${kind}_$n" --shape=queries=1x1x64 \
          --concurrency="$c" --client_threads="${CLIENT_THREADS:-4}" \
          --duration="$duration" --warmup=1s --output_format=json >"$result"
        python3 - "$result" "$backend" "$n" "$kind" "$c" "$(runs_by_backend "${kind}_$n")" <<'PY'
import json, sys
path, backend, n, kind, c, runs = sys.argv[1:]
r = json.load(open(path))
dtype = "bf16" if kind == "memory16" else "fp32"
lat = r["latency_ms"]
print("| %s | %s | %s | %s | %.0f | %.2f | %.2f | %s |" % (
    backend, n, dtype, c, r["throughput_rps"], lat["p50"], lat["p99"], runs),
    flush=True)
PY
      done
    done
  done
  grep -E "GPU: memory" "$out/server.log" | head -20 >&2 || true
  stop_server
done

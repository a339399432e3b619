#!/usr/bin/env bash
# The first appends after a load (issue #47): a memory of N key-value pairs
# (default 2,097,152, d = v = 64, float32: 1 GiB) written whole as the
# repository's weights file, attnserve started on it, then APPENDS appends
# of 1,024 rows (default 3) through `attnctl append`, each timed from the
# client. A grown memory is served in pieces (docs/repository.md#served-in-pieces),
# so the first append copies only its own rows, not the memory. Not part of
# the test suite (about a minute; needs twice the memory's size on disk).
#
# Usage: bench/first_append_bench.sh [N]   (default 2097152)
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
n="${1:-2097152}"
appends=${APPENDS:-3}
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
out=$(mktemp -d -t attnserve-first-append.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; rm -rf "$out"; }
trap cleanup EXIT

python3 bench/write_memories.py "$out/models" memory "$n" >/dev/null
# shellcheck source=bench/serve.sh
source bench/serve.sh
START_TRIES=600 start_server --http_port=0 --model_repository="$out/models"
for i in $(seq "$appends"); do
  started=$(date +%s%N)
  "$ctl" --target="127.0.0.1:$grpc_port" --deadline=60s append \
    --memory_name="memory_$n" --shape=keys=1024x64,values=1024x64 >/dev/null
  echo "append $i of 1,024 rows to memory_$n: $(( ($(date +%s%N) - started) / 1000000 )) ms"
done
stop_server

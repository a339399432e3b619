#!/usr/bin/env bash
# A memory past 2 GiB built by appends and queried back exactly (issue #47's
# size goal): attnserve over an empty repository, then
# build/bench/large_memory_check grows the memory `large` to ROWS rows
# (default 8,388,608: 4 GiB of F32 keys and values, d = v = 64) by appends
# of 1,024 rows and checks every answer it queries back (the ends, both
# sides of 2 GiB into each tensor, 1,024 spread rows), reporting the
# server's anonymous memory; then restarts it on the same repository and
# checks again. Not part of the test suite (a few minutes; needs ROWS x
# 1,024 bytes free on disk: the rows files and their mapped scratch copies).
#
# Usage: bench/large_memory_check.sh [ROWS]
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
check=${CHECK:-build/bench/large_memory_check}
rows="${1:-8388608}"
[[ -x "$server" && -x "$ctl" && -x "$check" ]] || { echo "build first: make build" >&2; exit 1; }
out=$(mktemp -d -t attnserve-large.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; rm -rf "$out"; }
trap cleanup EXIT
mkdir "$out/models"
# shellcheck source=bench/serve.sh
source bench/serve.sh
start_server --http_port=0 --model_repository="$out/models"
"$check" --target="127.0.0.1:$grpc_port" --rows="$rows" --pid="$pid"
du -sh "$out/models/large" | sed 's/^/on disk: /'
# The compactions the appends set off (docs/repository.md#compaction).
{ grep -h "compacted\|compaction failed" "$out/server.log" || true; } | sed 's/^/server: /'
stop_server
# A restart reads the rows files back (into scratch files, mapped): how
# long until it serves, and the same answers.
started=$(date +%s%N)
START_TRIES=6000 start_server --http_port=0 --model_repository="$out/models"
echo "restarted: serving after $(( ($(date +%s%N) - started) / 1000000 )) ms"
"$check" --target="127.0.0.1:$grpc_port" --rows="$rows" --pid="$pid" --nobuild
stop_server

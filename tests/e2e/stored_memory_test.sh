#!/usr/bin/env bash
# End-to-end: a stored memory through the real server and attnctl, and the
# batching flags as the docs state them (docs/batching.md, docs/flags.md):
#  - defaults: `attnctl attention --input` naming memory_name answers the
#    reference's output and weights (tests/e2e/stored_memory.py); the call
#    is batched, a call sending its own keys and values is not; queries of
#    another d are refused naming both shapes;
#  - --batch_stored_memories=false: the memory's calls run alone;
#  - --batching: every call is batched;
#  - attnctl append grows the memory (and --create makes one), attnctl
#    evict drops its oldest rows; the next call and the next server see
#    them.
#
#   tests/e2e/stored_memory_test.sh ATTNSERVE ATTNCTL
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 ATTNSERVE ATTNCTL" >&2
  exit 64
fi
server_bin=$(realpath "$1")
attnctl=$(realpath "$2")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
source "$repo/tests/lib/server.sh"

workdir=$(mktemp -d -t attnserve-memory.XXXXXX)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
check() {  # check DESCRIPTION CONDITION-EXIT-CODE [DETAIL]
  if [[ $2 -eq 0 ]]; then
    echo "ok   $1"
  else
    echo "FAIL $1${3:+: $3}"
    failures=$((failures + 1))
  fi
}
ctl() { "$attnctl" --target="127.0.0.1:$GRPC_PORT" --deadline=20s "$@"; }
batches() {  # the server's batches of scaled dot-product attention so far
  curl -s "http://127.0.0.1:$METRICS_PORT/metrics" >"$workdir/metrics.txt"
  "$py" "$here/metric.py" "$workdir/metrics.txt" attnserve_batch_size_count \
    rpc=ScaledDotProductAttention
}
serve() {  # serve LABEL [FLAGS...]
  local label=$1
  shift
  stop_server
  start_server "$server_bin" "$workdir/$label.log" --drain_notice_ms=0 \
    --model_repository="$workdir/models" "$@" ||
    { echo "stored_memory: FATAL: attnserve did not start ($label)" >&2; exit 1; }
}

"$py" "$here/stored_memory.py" write "$workdir/models"
"$py" "$here/stored_memory.py" request "$workdir/request.json"

serve defaults
ctl attention --input="$workdir/request.json" >"$workdir/response.json" \
  2>"$workdir/error.txt"
check "defaults: attnctl attention naming memory_name is answered" $? \
  "$(cat "$workdir/error.txt")"
"$py" "$here/stored_memory.py" check "$workdir/response.json"
check "defaults: output (1, 2, 3) and weights (1, 2, 300) match the reference" $?
[[ $(batches) == 1 ]]
check "defaults: the memory's call was batched" $? "batches: $(batches)"
ctl attention --shape=queries=1x2x8,keys=1x30x8,values=1x30x3 >/dev/null 2>&1
check "defaults: a call sending its keys and values is answered" $?
[[ $(batches) == 1 ]]
check "defaults: ... and runs alone" $? "batches: $(batches)"
ctl attention --memory_name=memory --shape=queries=1x1x5 >/dev/null \
  2>"$workdir/error.txt"
[[ $? -ne 0 ]] && grep -q "INVALID_ARGUMENT" "$workdir/error.txt" &&
  grep -q "holds keys (300, 8)" "$workdir/error.txt" &&
  grep -q "(1, 1, 5)" "$workdir/error.txt"
check "defaults: queries of d = 5 are refused naming both shapes" $? \
  "$(cat "$workdir/error.txt")"

serve alone --batch_stored_memories=false
ctl attention --input="$workdir/request.json" >"$workdir/response.json" 2>&1
check "--batch_stored_memories=false: the memory's call is answered" $?
"$py" "$here/stored_memory.py" check "$workdir/response.json"
check "--batch_stored_memories=false: ... with the reference's result" $?
[[ $(batches) == 0 || $(batches) == absent ]]
check "--batch_stored_memories=false: ... and ran alone" $? "batches: $(batches)"

serve everything --batching
ctl attention --shape=queries=1x2x8,keys=1x30x8,values=1x30x3 >/dev/null 2>&1
check "--batching: a call sending its keys and values is answered" $?
[[ $(batches) == 1 ]]
check "--batching: ... and batched" $? "batches: $(batches)"

# Appends (issue #47): attnctl append grows the memory at once and for good.
ctl append --memory_name=memory --shape=keys=5x8,values=5x3 \
  >"$workdir/append.json" 2>"$workdir/error.txt"
check "appends: attnctl append is answered" $? "$(cat "$workdir/error.txt")"
grep -q '"first_row":"300"' "$workdir/append.json" &&
  grep -q '"rows":"305"' "$workdir/append.json"
check "appends: ... rows 300-304 added, 305 held" $? "$(cat "$workdir/append.json")"
weights_columns() {  # the memory's weights' last dimension in a call now
  ctl attention --memory_name=memory --shape=queries=1x1x8 --return_weights \
    --summary 2>&1 | "$py" -c 'import json, sys
print(json.load(sys.stdin)["weights"]["shape"][-1])'
}
[[ $(weights_columns) == 305 ]]
check "appends: the next call attends over 305 rows" $? "$(weights_columns)"
model_metric() {  # model_metric NAME: the memory's sample of metric NAME
  curl -s "http://127.0.0.1:$METRICS_PORT/metrics" >"$workdir/metrics.txt"
  "$py" "$here/metric.py" "$workdir/metrics.txt" "$1" model=memory
}
[[ $(model_metric attnserve_model_rows) == 305 &&
   $(model_metric attnserve_model_files) == 2 &&
   $(model_metric attnserve_model_pieces) == 2 &&
   $(model_metric attnserve_model_appends_total) == 1 &&
   $(model_metric attnserve_model_append_seconds_count) == 1 ]]
check "appends: the metrics count 305 rows in 2 files and 2 pieces, 1 append" $? \
  "$(grep 'model="memory"' "$workdir/metrics.txt" | head -5)"
ctl append --memory_name=memory --shape=keys=2x7,values=2x3 >/dev/null \
  2>"$workdir/error.txt"
[[ $? -ne 0 ]] && grep -q "INVALID_ARGUMENT" "$workdir/error.txt" &&
  grep -q "keys: shape (2, 7) must be (n, 8)" "$workdir/error.txt"
check "appends: rows of d = 7 are refused naming the field" $? \
  "$(cat "$workdir/error.txt")"
ctl append --memory_name=made --create --score=gaussian --precision=bf16 \
  >/dev/null 2>"$workdir/error.txt"
check "appends: attnctl append --create makes a memory" $? \
  "$(cat "$workdir/error.txt")"

ctl evict --memory_name=memory --oldest=5 >"$workdir/evict.json" \
  2>"$workdir/error.txt"
check "appends: attnctl evict is answered" $? "$(cat "$workdir/error.txt")"
grep -q '"evicted":"5"' "$workdir/evict.json" &&
  grep -q '"rows":"300"' "$workdir/evict.json"
check "appends: ... 5 rows evicted, 300 held" $? "$(cat "$workdir/evict.json")"

serve restarted
[[ $(weights_columns) == 300 ]]
check "appends: after a restart the memory holds the 300 rows" $? \
  "$(weights_columns)"

if [[ $failures -ne 0 ]]; then
  echo "stored_memory: $failures check(s) failed"
  exit 1
fi
echo "stored_memory: passed"

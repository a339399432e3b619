#!/usr/bin/env bash
# End-to-end: connections that age out are replaced, and nothing is lost.
#
#   tests/e2e/connection_age_test.sh ATTNSERVE ATTNCTL
#
# attnserve --grpc_max_connection_age_ms asks clients to reconnect (GOAWAY)
# once a connection is that old, so that a client behind an L4 load balancer
# is spread over new replicas; --grpc_max_connection_age_grace_ms lets the
# calls in flight on the old connection finish. With an age of 400 ms this
# runs, at once:
#  - one FitBandwidth call of ~2 s (it outlives its connection's age and must
#    still succeed), and
#  - 3 s of closed-loop load on 2 connections (every call must succeed: the
#    client must reconnect each time its connection is aged out),
# while sampling the server's established TCP connections with ss: it must
# see several times more distinct client ports than connections open at any
# one moment, i.e. connections really were replaced.
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

workdir=$(mktemp -d -t attnserve-age.XXXXXX)
fit_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  [[ -n "$fit_pid" ]] && kill "$fit_pid" 2>/dev/null
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

start_server "$server_bin" "$workdir/server.log" --drain_notice_ms=0 \
  --grpc_max_connection_age_ms=400 --grpc_max_connection_age_grace_ms=30000 ||
  { echo "age: FATAL: attnserve did not start" >&2; exit 1; }
target=127.0.0.1:$GRPC_PORT

"$attnctl" --target="$target" --deadline=60s fit-bandwidth \
  --shape=x_train=2048,y_train=2048 --epochs=30 --summary \
  >"$workdir/fit.json" 2>"$workdir/fit.err" &
fit_pid=$!
"$attnctl" --target="$target" --deadline=20s load --rpc=attention \
  --concurrency=8 --client_threads=2 --duration=3s --output_format=json \
  >"$workdir/load.json" 2>"$workdir/load.err" &
load_pid=$!

# Client ports of established connections to the server, every 50 ms.
: >"$workdir/ports"
max_open=0
while kill -0 "$load_pid" 2>/dev/null; do
  ss -Htn state established "( sport = :$GRPC_PORT )" |
    awk '{print $NF}' >"$workdir/now"
  open=$(wc -l <"$workdir/now")
  ((open > max_open)) && max_open=$open
  cat "$workdir/now" >>"$workdir/ports"
  sleep 0.05
done
wait "$load_pid"
load_rc=$?
wait "$fit_pid"
fit_rc=$?
fit_pid=""
distinct=$(sort -u "$workdir/ports" | wc -l)

if [[ $fit_rc == 0 ]]; then
  pass "a FitBandwidth call longer than the connection age completed"
else
  fail "FitBandwidth across the connection age: exit $fit_rc: $(head -c 300 "$workdir/fit.err")"
fi
read -r completed ok errors < <("$py" - "$workdir/load.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print(report["requests"], report["ok"], sum(report["errors"].values()) + report["dropped"])
PY
)
if [[ $load_rc == 0 && "${errors:-1}" == 0 && "${ok:-0}" -gt 0 && "$ok" == "$completed" ]]; then
  pass "3 s of load across reconnects: $ok calls, all OK"
else
  fail "load across reconnects: exit $load_rc, ${ok:-?} of ${completed:-?} OK, ${errors:-?} errors: $(head -c 400 "$workdir/load.json") $(head -c 200 "$workdir/load.err")"
fi
if ((max_open > 0 && distinct >= 2 * max_open)); then
  pass "connections were replaced: $distinct client ports seen, at most $max_open open at once"
else
  fail "connections not replaced: $distinct client ports seen, at most $max_open open at once"
fi

echo "age: $failures failed"
((failures == 0))

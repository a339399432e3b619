#!/usr/bin/env bash
# End-to-end: a call that outlives the grace period must not hold the server.
#
#   tests/e2e/drain_overrun_test.sh ATTNSERVE ATTNCTL
#
# server/main.cc promises: SIGTERM "lets in-flight calls finish for up to
# --grace_period_ms, cancels the rest and exits 0". This starts attnserve
# with --grace_period_ms=1000, one worker, and a FitBandwidth call of ~20 s
# (n = 2048, 300 epochs), sends SIGTERM while it runs, and checks that
#  - the call fails (exit 2) soon after the grace period, and
#  - the server exits 0 within the grace period plus 3 s of teardown.
# The server is always stopped (trap; SIGKILL after 10 s if it must).
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

workdir=$(mktemp -d -t attnserve-overrun.XXXXXX)
call_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  [[ -n "$call_pid" ]] && kill "$call_pid" 2>/dev/null
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

grace_ms=1000
start_server "$server_bin" "$workdir/server.log" --grace_period_ms=$grace_ms \
  --drain_notice_ms=0 \
  --worker_threads=1 --kernel_threads=1 ||
  { echo "overrun: FATAL: attnserve did not start" >&2; exit 1; }
ctl() { "$attnctl" --target="127.0.0.1:$GRPC_PORT" "$@"; }
for ((i = 0; i < 100; i++)); do
  ctl health 2>/dev/null | grep -q '"SERVING"' && break
  sleep 0.1
done

failures=0
ctl --deadline=60s fit-bandwidth --shape=x_train=2048,y_train=2048 --epochs=300 \
  --summary >"$workdir/call.json" 2>"$workdir/call.err" &
call_pid=$!
inflight=0
for ((i = 0; i < 200; i++)); do
  curl -fsS --max-time 1 "http://127.0.0.1:$METRICS_PORT/metrics" -o "$workdir/m.txt" 2>/dev/null &&
    inflight=$("$py" "$here/metric.py" "$workdir/m.txt" attnserve_inflight_requests)
  [[ "$inflight" == 1 ]] && break
  sleep 0.02
done
[[ "$inflight" == 1 ]] || { echo "FAIL the call never went in flight" >&2; exit 1; }
sleep 0.3
start=$(date +%s.%N)
kill -TERM "$SERVER_PID"
elapsed() { awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $start}"; }

rc=0
wait "$call_pid" || rc=$?
call_pid=""
if [[ $rc -eq 2 ]]; then
  echo "ok   the overrunning call ended after $(elapsed) s: $(head -c 200 "$workdir/call.err")"
else
  echo "FAIL the overrunning call: exit $rc after $(elapsed) s, expected exit 2" >&2
  failures=$((failures + 1))
fi

for ((i = 0; i < grace_ms / 100 + 30; i++)); do
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$SERVER_PID" 2>/dev/null; then
  echo "FAIL attnserve still running $(elapsed) s after SIGTERM" \
    "(--grace_period_ms=$grace_ms): the worker keeps computing the" \
    "cancelled call and shutdown waits for it" >&2
  failures=$((failures + 1))
else
  rc=0
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  if [[ $rc -eq 0 ]]; then
    echo "ok   attnserve exited 0 after $(elapsed) s"
  else
    echo "FAIL attnserve exited with status $rc" >&2
    failures=$((failures + 1))
  fi
fi
echo "overrun: $failures failed"
[[ $failures -eq 0 ]]

#!/usr/bin/env bash
# End-to-end: the HTTP port's limits and drain (tests/e2e/http_defences.py):
# the connection cap, slow and idle clients, header and body caps, and the
# drain's three promises (not ready during the notice, refused after it,
# accepted calls finished), each against a real attnserve; and the README's
# curl lines, whose output must be what the README shows.
#
#   tests/e2e/http_defences_test.sh ATTNSERVE
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 ATTNSERVE" >&2
  exit 64
fi
server_bin=$(realpath "$1")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$repo/tests/lib/server.sh"

workdir=$(mktemp -d -t attnserve-http.XXXXXX)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

status=0
start_server "$server_bin" "$workdir/limits.log" --drain_notice_ms=0 \
  --http_max_connections=8 --http_request_timeout_ms=1500 \
  --http_max_header_bytes=4096 --max_message_bytes=1048576 ||
  { echo "http_defences: FATAL: attnserve did not start" >&2; exit 1; }
/usr/bin/python3 "$here/http_defences.py" readme "$HTTP_PORT" "$repo/README.md" ||
  status=1
/usr/bin/python3 "$here/http_defences.py" limits "$HTTP_PORT" "$METRICS_PORT" ||
  status=1
kill -0 "$SERVER_PID" 2>/dev/null || { echo "FAIL the server died"; status=1; }
stop_server

start_server "$server_bin" "$workdir/drain.log" --drain_notice_ms=1500 \
  --grace_period_ms=60000 --worker_threads=1 --kernel_threads=1 ||
  { echo "http_defences: FATAL: attnserve did not start" >&2; exit 1; }
/usr/bin/python3 "$here/http_defences.py" drain "$HTTP_PORT" "$SERVER_PID" ||
  status=1
for ((i = 0; i < 300; i++)); do
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$SERVER_PID" 2>/dev/null; then
  echo "FAIL drain: the server did not exit within 30 s of the drain"
  status=1
else
  wait "$SERVER_PID"
  code=$?
  [[ $code -eq 0 ]] && echo "ok   drain: the server exited 0" ||
    { echo "FAIL drain: the server exited $code"; status=1; }
  SERVER_PID=""
fi
[[ $status -eq 0 ]] || sed 's/^/  | /' "$workdir"/*.log >&2
echo "http_defences: $([[ $status -eq 0 ]] && echo passed || echo FAILED)"
exit "$status"

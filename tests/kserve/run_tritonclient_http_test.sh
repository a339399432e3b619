#!/usr/bin/env bash
# The KServe v2 HTTP/REST test: NVIDIA's own Python client
# (tritonclient[http] from PyPI) against the real attnserve binary's REST
# front end (--http_port), compared with tritonclient[grpc] on its gRPC port.
#
#   tests/kserve/run_tritonclient_http_test.sh ATTNSERVE VENV_DIR
#
# ATTNSERVE: the server binary (build/server/attnserve).
# VENV_DIR:  where to keep the test's virtual environment
#            (build/tests/tritonhttpvenv). It is made once with Debian's
#            /usr/bin/python3 -m venv and the pins of tests/kserve/
#            requirements-http.txt from PyPI, and made again when that file
#            changes.
#
# Runs tritonclient_http_test.py three times, each time against a fresh
# server on free loopback ports: with the plain flags; with --batching (so
# every model goes through the dynamic batcher); and with a writable copy of
# deploy/models as --model_repository and --model_control_mode=explicit
# (repository models, live load and unload). Every run has
# --max_message_bytes=1048576 (the test's over-the-limit cases are sized
# against it) and --drain_notice_ms=0. The test imports
# tritonclient_test.py's float64 reference, and that module imports the
# typed API's Python stubs: they are generated from
# proto/attention/v1/attention.proto into a temporary folder. The server is
# always stopped. Exit 0 when every test of every run passed; the last line
# is "N passed, M failed" over all runs.
# Run from anywhere; paths in the repository are found from this file.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 ATTNSERVE VENV_DIR" >&2
  exit 64
fi
server_bin=$(realpath "$1")
venv=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
requirements=$here/requirements-http.txt
name=run_tritonclient_http_test.sh

source "$repo/tests/lib/server.sh"
source "$repo/tests/lib/venv.sh"

workdir=$(mktemp -d -t attnserve-kserve-http.XXXXXX)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ ! -x "$server_bin" ]]; then
  echo "$name: no server binary at $server_bin" >&2
  exit 1
fi
if ! command -v curl >/dev/null; then
  echo "$name: the test runs curl lines like the README's; install curl" >&2
  exit 1
fi

# --- The virtual environment, made once and cached. ------------------------
ensure_venv "$venv" "$requirements"
python=$venv/bin/python

# --- The typed API's stubs, which tritonclient_test.py imports. -------------
"$python" -m grpc_tools.protoc --proto_path="$repo/proto" \
  --python_out="$workdir" --grpc_python_out="$workdir" \
  "$repo/proto/attention/v1/attention.proto"

# --- The three server configurations. ---------------------------------------
total_passed=0
total_failed=0
status=0
# A writable copy of the example repository: the test adds a folder to it.
repository=$workdir/models
cp -r "$repo/deploy/models" "$repository"
for mode in plain batching repository; do
  flags=(--max_message_bytes=1048576 --drain_notice_ms=0)
  [[ $mode == batching ]] && flags+=(--batching)
  [[ $mode == repository ]] &&
    flags+=(--model_repository="$repository" --model_control_mode=explicit)
  log=$workdir/server-$mode.log
  echo "$name: [$mode] attnserve ${flags[*]}"
  if ! start_server "$server_bin" "$log" "${flags[@]}"; then
    echo "$name: [$mode] the server did not start" >&2
    status=1
    total_failed=$((total_failed + 1))
    continue
  fi
  echo "$name: [$mode] attnserve pid $SERVER_PID on HTTP" \
    "127.0.0.1:$HTTP_PORT, gRPC 127.0.0.1:$GRPC_PORT"

  run_status=0
  PYTHONPATH=$workdir ATTNSERVE_HTTP_PORT=$HTTP_PORT \
    ATTNSERVE_TARGET=127.0.0.1:$GRPC_PORT ATTNSERVE_MODE=$mode \
    ATTNSERVE_REPOSITORY=$([[ $mode == repository ]] && echo "$repository") \
    "$python" "$here/tritonclient_http_test.py" 2>&1 |
    tee "$workdir/out-$mode.txt" || run_status=$?
  summary=$(tail -n 1 "$workdir/out-$mode.txt")
  if [[ $summary =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    total_passed=$((total_passed + BASH_REMATCH[1]))
    total_failed=$((total_failed + BASH_REMATCH[2]))
  else
    total_failed=$((total_failed + 1))  # the test itself broke
    run_status=1
  fi

  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "$name: [$mode] attnserve died during the test; its log:" >&2
    sed 's/^/  | /' "$log" >&2
    run_status=1
  elif [[ $run_status -ne 0 ]]; then
    echo "$name: [$mode] server log:" >&2
    sed 's/^/  | /' "$log" >&2
  fi
  stop_server
  [[ $run_status -eq 0 ]] || status=1
done

if [[ $status -ne 0 && $total_failed -eq 0 ]]; then total_failed=1; fi
echo "$total_passed passed, $total_failed failed"
exit "$status"

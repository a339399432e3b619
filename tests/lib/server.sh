#!/usr/bin/env bash
# shellcheck shell=bash
# Shared helpers of the cross-layer tests: free loopback ports, starting
# attnserve in the background and always stopping it. Source it; it defines
# functions and the globals SERVER_PID, GRPC_PORT, HTTP_PORT, METRICS_PORT.
#
#   source tests/lib/server.sh
#   trap stop_server EXIT
#   start_server build/server/attnserve "$workdir/server.log" --kernel_threads=1
#
# Needs /usr/bin/python3 (for the port picker) and coreutils.

SERVER_PID=""
GRPC_PORT=""
HTTP_PORT=""
METRICS_PORT=""

# resolve_binaries NAME REPO [ATTNSERVE ATTNCTL]: sets the globals
# server_bin and attnctl to absolute paths: the arguments when given, else
# $ATTNSERVE / $ATTNCTL, else REPO's build/. Exits 1, naming NAME (the
# calling script), when one is not an executable.
resolve_binaries() {
  local name=$1 repo=$2 tool
  server_bin=${3:-${ATTNSERVE:-$repo/build/server/attnserve}}
  attnctl=${4:-${ATTNCTL:-$repo/build/client/attnctl}}
  for tool in "$server_bin" "$attnctl"; do
    [[ -x "$tool" ]] || { echo "$name: FATAL: no executable at $tool" >&2; exit 1; }
  done
  server_bin=$(realpath "$server_bin")
  attnctl=$(realpath "$attnctl")
}

# Prints a TCP port that was free on 127.0.0.1 a moment ago.
free_port() {
  /usr/bin/python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# start_server BINARY LOG [FLAGS...]: starts BINARY on 127.0.0.1 with fresh
# free ports and waits (at most 10 s) for its "listening" line. A port taken
# between the pick and the bind makes the server exit at boot ("cannot
# listen" / "cannot serve metrics"); then it tries again with new ports,
# three times in all. Returns 1 when it never came up.
start_server() {
  local binary=$1 log=$2
  shift 2
  local attempt i
  for attempt in 1 2 3; do
    GRPC_PORT=$(free_port)
    METRICS_PORT=$(free_port)
    while [[ "$METRICS_PORT" == "$GRPC_PORT" ]]; do METRICS_PORT=$(free_port); done
    HTTP_PORT=$(free_port)
    while [[ "$HTTP_PORT" == "$GRPC_PORT" || "$HTTP_PORT" == "$METRICS_PORT" ]]; do
      HTTP_PORT=$(free_port)
    done
    "$binary" --host=127.0.0.1 --grpc_port="$GRPC_PORT" \
      --metrics_port="$METRICS_PORT" --http_port="$HTTP_PORT" "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    for ((i = 0; i < 100; i++)); do
      if grep -q "attnserve listening on" "$log" 2>/dev/null; then
        return 0
      fi
      if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
      sleep 0.1
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "server.sh: attnserve did not come up within 10 s" >&2
      stop_server
      return 1
    fi
    wait "$SERVER_PID" 2>/dev/null
    echo "server.sh: attnserve exited at boot (attempt $attempt):" >&2
    sed 's/^/  | /' "$log" >&2
    SERVER_PID=""
    # Only a lost port race is worth another try.
    grep -q -e "cannot listen" -e "cannot serve metrics" "$log" || return 1
  done
  return 1
}

# Stops the server started by start_server, if it still runs: SIGTERM, then
# SIGKILL after 10 s. Safe to call twice; meant for `trap stop_server EXIT`.
stop_server() {
  local i
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for ((i = 0; i < 100; i++)); do
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "server.sh: attnserve ignored SIGTERM for 10 s; SIGKILL" >&2
      kill -KILL "$SERVER_PID" 2>/dev/null
    fi
    wait "$SERVER_PID" 2>/dev/null
  fi
  SERVER_PID=""
}

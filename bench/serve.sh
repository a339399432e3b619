# Sourced by the bench scripts that drive a real attnserve: starts and stops
# it on free loopback ports. Needs $server, $ctl and $out (its log goes to
# $out/server.log); sets pid, grpc_port and metrics_port. Extra flags for
# every start: ATTNSERVE_FLAGS. START_TRIES: how many 0.1 s waits for it to
# answer health (default 100; more for large model repositories);
# START_POLL: the wait in seconds (default 0.1).
# shellcheck shell=bash disable=SC2154  # server, ctl, out: the sourcing script's

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_server() {  # flags...
  grpc_port=$(free_port)
  metrics_port=$(free_port)
  # shellcheck disable=SC2086  # ATTNSERVE_FLAGS is a flag list
  "$server" --host=127.0.0.1 --grpc_port="$grpc_port" \
    --metrics_port="$metrics_port" --drain_notice_ms=0 ${ATTNSERVE_FLAGS:-} \
    "$@" >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq "${START_TRIES:-100}"); do
    "$ctl" --target="127.0.0.1:$grpc_port" health >/dev/null 2>&1 && return
    sleep "${START_POLL:-0.1}"
  done
  echo "attnserve did not start:" >&2
  cat "$out/server.log" >&2
  exit 1
}

stop_server() {
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
}

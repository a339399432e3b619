#!/usr/bin/env bash
# Scale-out on one machine with real parts: attnserve replicas behind nginx
# (deploy/nginx/attnserve.conf), driven by attnctl load, then a rolling
# restart under load: each replica in turn gets SIGTERM (it reports
# NOT_SERVING and keeps serving for --drain_notice_ms, then closes its
# listener and drains in-flight calls), exits, and is started again on the
# same port before the next one goes.
#
#   tests/scaleout/rolling_restart.sh ATTNSERVE ATTNCTL [--short]
#
# Pass: every replica exits 0 on SIGTERM and comes back SERVING, and not one
# call of the load fails (errors and dropped calls both 0) for a client that
# resends a call answered UNAVAILABLE once (see load() below): none on the
# direct connection, at most 16 (the calls in flight) behind the proxy. Prints a table:
# one replica direct, three behind nginx, and three behind nginx during the
# rolling restart, all measured in this run. --short (CI) runs each phase
# for 2 s instead of 5 s. Needs Debian's nginx (deploy/install_deps.sh).
set -uo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 ATTNSERVE ATTNCTL [--short]" >&2
  exit 64
fi
server_bin=$(realpath "$1")
attnctl=$(realpath "$2")
phase_s=5
[[ "${3:-}" == "--short" ]] && phase_s=2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
source "$repo/tests/lib/server.sh"
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] ||
  { echo "scaleout: FATAL: nginx not installed (deploy/install_deps.sh)" >&2; exit 1; }
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

readonly replicas=3
workdir=$(mktemp -d -t attnserve-scaleout.XXXXXX)
declare -a pids grpc_ports metrics_ports
nginx_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local pid
  for pid in "${pids[@]}" $nginx_pid; do
    [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  [[ -n "${KEEP_WORKDIR:-}" ]] || rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# start_replica I: starts replica I on its ports and waits for SERVING.
start_replica() {
  local i=$1 n
  "$server_bin" --host=127.0.0.1 --grpc_port="${grpc_ports[$i]}" \
    --metrics_port="${metrics_ports[$i]}" --http_port=0 --drain_notice_ms=1000 \
    --grace_period_ms=5000 --worker_threads=1 \
    >>"$workdir/replica$i.log" 2>&1 &
  pids[$i]=$!
  for ((n = 0; n < 100; n++)); do
    "$attnctl" --target="127.0.0.1:${grpc_ports[$i]}" --deadline=1s health \
      2>/dev/null | grep -q '"SERVING"' && return 0
    sleep 0.1
  done
  return 1
}

for ((i = 0; i < replicas; i++)); do
  grpc_ports[$i]=$(free_port)
  metrics_ports[$i]=$(free_port)
  start_replica "$i" || { fail "replica $i did not start"; exit 1; }
done
proxy_port=$(free_port)
# write_nginx_conf [DOWN]: the proxy's configuration, replica DOWN (if any)
# marked down, as an orchestrator (Kubernetes removing a terminating pod's
# endpoint) takes a replica out before stopping it.
write_nginx_conf() {
  local down=${1:-} upstream="" i flags
  for ((i = 0; i < replicas; i++)); do
    flags="max_fails=1 fail_timeout=2s"
    [[ "$i" == "$down" ]] && flags="down"
    upstream+="  server 127.0.0.1:${grpc_ports[$i]} $flags;"$'\n'
  done
  {
    echo "daemon off; worker_processes 1; pid $workdir/nginx.pid;"
    echo "error_log $workdir/nginx_error.log ${NGINX_LOG_LEVEL:-warn};"
    echo "events { worker_connections 1024; }"
    echo "http { access_log off;"
    for temp in client_body proxy fastcgi uwsgi scgi; do
      echo "  ${temp}_temp_path $workdir/$temp;"
    done
    "$py" - "$repo/deploy/nginx/attnserve.conf" "$upstream" "127.0.0.1:$proxy_port" <<'PY'
import sys
text = open(sys.argv[1]).read()
print(text.replace("@UPSTREAM_SERVERS@", sys.argv[2].rstrip("\n"))
          .replace("@LISTEN@", sys.argv[3]))
PY
    echo "}"
  } >"$workdir/nginx.conf"
}
# reload_nginx [DOWN]: a graceful reload: new workers take the new
# configuration, old ones finish their calls and close their connections.
# Returns once the old workers have exited: until then they may still route
# calls by the old configuration (they finish their clients' streams first).
reload_nginx() {
  local old n pid alive
  old=$(pgrep -P "$nginx_pid" || true)
  write_nginx_conf "${1:-}"
  "$nginx_bin" -c "$workdir/nginx.conf" -e "$workdir/nginx_error.log" -s reload
  for ((n = 0; n < 100; n++)); do
    alive=0
    for pid in $old; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  echo "scaleout: old nginx workers still running 10 s after a reload" >&2
}
write_nginx_conf
"$nginx_bin" -t -c "$workdir/nginx.conf" -e "$workdir/nginx_error.log" \
  >"$workdir/nginx_t.log" 2>&1 ||
  { fail "nginx -t: $(cat "$workdir/nginx_t.log")"; exit 1; }
"$nginx_bin" -c "$workdir/nginx.conf" -e "$workdir/nginx_error.log" &
nginx_pid=$!
for ((n = 0; n < 50; n++)); do
  "$attnctl" --target="127.0.0.1:$proxy_port" --deadline=1s health 2>/dev/null |
    grep -q '"SERVING"' && break
  sleep 0.1
done

# load TARGET SECONDS OUT: closed-loop attention load, 16 in flight. A call
# that ends UNAVAILABLE is sent once more, as a client behind a proxy should:
# when nginx reloads, its old workers send GOAWAY, and a call the client
# sent as the GOAWAY crossed it can come back UNAVAILABLE ("GOAWAY
# received") from gRPC 1.51's client instead of being retried by it (one
# call in about 1,200 reloads here, at ~10,000 calls/s). Every attnserve
# RPC is safe to send again.
load() {
  "$attnctl" --target="$1" --deadline=30s load --rpc=attention \
    --concurrency=16 --client_threads=2 --duration="${2}s" --retries=1 \
    --output_format=json >"$3" 2>"$3.err"
}
# row NAME FILE MAX_RETRIED: one table row from a load report; fails on any
# error or dropped call, and on more resends than MAX_RETRIED (a replica
# that refused calls it was sent, rather than a GOAWAY crossing a few).
row() {
  "$py" - "$1" "$2" "$3" <<'PY'
import json, sys
name, path, max_retried = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(path))
errors = sum(r["errors"].values())
lat = r["latency_ms"]
print(f"| {name} | {r['throughput_rps']:.0f} | {lat['p50']:.2f} | {lat['p99']:.2f} "
      f"| {r['requests']} | {errors} | {r['dropped']} | {r['retried']} |")
sys.exit(1 if errors or r["dropped"] or r["ok"] != r["requests"]
         or r["retried"] > max_retried else 0)
PY
}

load "127.0.0.1:${grpc_ports[0]}" "$phase_s" "$workdir/direct.json"
load "127.0.0.1:$proxy_port" "$phase_s" "$workdir/proxy.json"

# The rolling restart, under load through the proxy.
restart_s=$((replicas * 3 + 2))
load "127.0.0.1:$proxy_port" "$restart_s" "$workdir/rolling.json" &
load_pid=$!
sleep 1
for ((i = 0; i < replicas; i++)); do
  # Out of the proxy first (without this step, calls that reach a replica in
  # the instant gRPC shuts its server down are cancelled by gRPC itself: see
  # docs/deploy.md, "Scale-out"), then drained and stopped.
  [[ -z "${NO_RELOAD:-}" ]] && reload_nginx "$i"
  kill -TERM "${pids[$i]}"
  wait "${pids[$i]}"
  rc=$?
  [[ $rc == 0 ]] && pass "replica $i drained and exited 0 on SIGTERM" ||
    fail "replica $i exited $rc on SIGTERM"
  start_replica "$i" && pass "replica $i restarted and SERVING" ||
    fail "replica $i did not come back"
  [[ -z "${NO_RELOAD:-}" ]] && reload_nginx
  sleep 1
done
wait "$load_pid"

echo
echo "| phase | req/s | p50 ms | p99 ms | calls | errors | dropped | retried |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
row "1 replica, direct" "$workdir/direct.json" 0 ||
  fail "direct load had errors or resends: $(cat "$workdir/direct.json")"
row "$replicas replicas behind nginx" "$workdir/proxy.json" 16 ||
  fail "proxied load had errors or resends: $(cat "$workdir/proxy.json")"
# Behind the proxy, a GOAWAY (a reload's, or nginx's after a connection's
# 1000th call) may cross a few calls, never more than are in flight.
row "$replicas replicas behind nginx, rolling restart" "$workdir/rolling.json" 16 ||
  fail "calls were lost or refused during the rolling restart: $(cat "$workdir/rolling.json")"
echo
echo "scaleout: $failures failed"
((failures == 0))

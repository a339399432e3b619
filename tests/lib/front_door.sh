#!/usr/bin/env bash
# shellcheck shell=bash
# The shipped front door (deploy/nginx/front-door.conf) made runnable on a
# shared machine: every listen port a free loopback one, both upstreams the
# test server's ports, its scratch folder the test's. Source it after
# tests/lib/server.sh (free_port); used by tests/faults/fault_test.sh,
# tests/deploy/k8s/k8s_test.sh, tests/deploy/monitoring/monitoring_test.sh
# and deploy/container/test_image.sh, so all of them run the very file that
# is deployed, and a port added to it fails them here until it is added
# below.
#
#   front_door_conf SRC DST GRPC_UPSTREAM HTTP_UPSTREAM [SCRATCH]
#
# Writes DST from SRC: listen 8001 (gRPC), 8000 (HTTP) and 8081 (the door's
# health and stub_status) become 127.0.0.1:<free port>, in the globals
# DOOR_GRPC_PORT, DOOR_HTTP_PORT and DOOR_STATUS_PORT; the upstream servers
# 127.0.0.1:9001 and 127.0.0.1:9000 become GRPC_UPSTREAM and HTTP_UPSTREAM
# (host:port); /tmp/nginx becomes SCRATCH when given. Returns 1, naming the
# lines, when a listen or an upstream server of SRC was left as it was.

DOOR_GRPC_PORT=""
DOOR_HTTP_PORT=""
DOOR_STATUS_PORT=""

front_door_conf() {
  local src=$1 dst=$2 grpc_upstream=$3 http_upstream=$4 scratch=${5:-}
  DOOR_GRPC_PORT=$(free_port)
  DOOR_HTTP_PORT=$(free_port)
  while [[ "$DOOR_HTTP_PORT" == "$DOOR_GRPC_PORT" ]]; do DOOR_HTTP_PORT=$(free_port); done
  DOOR_STATUS_PORT=$(free_port)
  while [[ "$DOOR_STATUS_PORT" == "$DOOR_GRPC_PORT" || "$DOOR_STATUS_PORT" == "$DOOR_HTTP_PORT" ]]; do
    DOOR_STATUS_PORT=$(free_port)
  done
  local rewrite=(
    -e "s#^\([[:space:]]*\)listen 8001\b#\1listen 127.0.0.1:$DOOR_GRPC_PORT#"
    -e "s#^\([[:space:]]*\)listen 8000\b#\1listen 127.0.0.1:$DOOR_HTTP_PORT#"
    -e "s#^\([[:space:]]*\)listen 8081\b#\1listen 127.0.0.1:$DOOR_STATUS_PORT#"
    -e "s#^\([[:space:]]*\)server 127\.0\.0\.1:9001;#\1server $grpc_upstream;#"
    -e "s#^\([[:space:]]*\)server 127\.0\.0\.1:9000;#\1server $http_upstream;#"
  )
  [[ -z "$scratch" ]] || rewrite+=(-e "s#/tmp/nginx#$scratch#g")
  sed "${rewrite[@]}" "$src" >"$dst" || return 1
  # Every listen must now be on loopback, every upstream server one of ours.
  local left line
  left=$(grep -nE '^[[:space:]]*(listen[[:space:]]|server[[:space:]]+[^{[:space:]]+;)' "$dst" |
    grep -vE "listen 127\.0\.0\.1:[0-9]+|server ($grpc_upstream|$http_upstream);" || true)
  if [[ -n "$left" ]]; then
    echo "front_door.sh: $src has a listen or upstream this helper does not rewrite" \
      "(add it to front_door_conf):" >&2
    while IFS= read -r line; do echo "  | $line" >&2; done <<<"$left"
    return 1
  fi
}

#!/usr/bin/env bash
# The monitoring files (deploy/prometheus, deploy/grafana, deploy/compose.yaml)
# proved against a real Prometheus scraping a real attnserve.
#
#   tests/deploy/monitoring/monitoring_test.sh ATTNSERVE ATTNCTL VENV_DIR
#
# ATTNSERVE, ATTNCTL: the binaries (build/server/attnserve, build/client/attnctl).
# VENV_DIR: where to keep the test's virtual environment (PyYAML,
#   check-jsonschema, podman-compose; pins in requirements.txt beside this
#   file). Made once with Debian's /usr/bin/python3 -m venv, remade when
#   requirements.txt changes.
#
# 0. Starts attnserve (--batching, a small --max_request_elements) on free
#    loopback ports, and Prometheus on loopback with deploy/prometheus's own
#    config and rule files, retargeted and scraping every second.
# 1. Files, meanwhile: promtool check config / check rules / test rules
#    (rules_test.yml); the compose file against the Compose Specification's
#    JSON schema and through podman-compose --dry-run; the dashboard's
#    structure and the wiring of compose, Prometheus and Grafana
#    (files_check.py).
# 2. Live: a few seconds of `attnctl load` on every RPC, with some requests
#    that fail (INVALID_ARGUMENT, RESOURCE_EXHAUSTED); then every recording
#    rule, alert and dashboard expression through Prometheus's HTTP API
#    (live_check.py serving).
# 3. Down: the server is stopped; AttnserveTargetDown's expression must see it
#    and Prometheus must make the alert pending (live_check.py down).
# The server and Prometheus are always stopped (trap). ~20 s once the venv
# exists. Needs Debian's prometheus (prometheus, promtool), curl, python3,
# python3-venv; PyPI the first time.
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 ATTNSERVE ATTNCTL VENV_DIR" >&2
  exit 64
fi
server_bin=$(realpath "$1")
attnctl=$(realpath "$2")
venv=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
started=$SECONDS

source "$repo/tests/lib/server.sh"
source "$repo/tests/lib/front_door.sh"
source "$repo/tests/lib/venv.sh"

workdir=$(mktemp -d -t attnserve-monitoring.XXXXXX)
prom_pid=""
load_pids=()
extra_pids=()  # the front door and its exporter
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local pid
  for pid in "${load_pids[@]}" "${extra_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [[ -n "$prom_pid" ]]; then
    kill "$prom_pid" 2>/dev/null || true
    wait "$prom_pid" 2>/dev/null || true
  fi
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in "$server_bin" "$attnctl"; do
  [[ -x "$tool" ]] || { echo "monitoring: FATAL: no executable at $tool" >&2; exit 1; }
done
for tool in prometheus promtool curl; do
  command -v "$tool" >/dev/null ||
    { echo "monitoring: FATAL: $tool not found (Debian: prometheus, curl)" >&2; exit 1; }
done

passed=0
failed=0
# step NAME COMMAND...: runs one check, keeps going when it fails (set -e
# does not apply inside an `if`), and shows the output only on failure.
step() {
  local name=$1 t0=$SECONDS
  shift
  if "$@" >"$workdir/step.out" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1))
    echo "FAIL $name ($((SECONDS - t0)) s)" >&2
    sed 's/^/  | /' "$workdir/step.out" >&2
  fi
}

prom_dir=$repo/deploy/prometheus
compose=$repo/deploy/compose.yaml

ensure_venv "$venv" "$here/requirements.txt"
python=$venv/bin/python

# --- 0. Start attnserve and Prometheus. ------------------------------------
# First, because Prometheus takes ~5 s to its first scrape (its discovery
# manager hands targets over on a 5 s tick, not configurable in 2.42): the
# file checks of part 1 run meanwhile.
#
# --batching so the batch metrics have data; a small --max_request_elements
# so an oversized request is refused with RESOURCE_EXHAUSTED (a rejection);
# one kernel thread, as the other cross-layer tests, for these 2 cores.
start_server "$server_bin" "$workdir/server.log" --batching \
  --max_request_elements=65536 --kernel_threads=1 \
  --model_repository="$repo/deploy/models"
echo "monitoring: attnserve on 127.0.0.1:$GRPC_PORT, metrics :$METRICS_PORT"

# The front door in front of it, as deployed (deploy/nginx/front-door.conf,
# ports, upstreams and scratch folder rewritten by tests/lib/front_door.sh),
# and its exporter: the dashboard's front-door panel and
# AttnserveFrontDoorDown read them.
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
exporter_bin=$(command -v prometheus-nginx-exporter || echo /usr/bin/prometheus-nginx-exporter)
for tool in "$nginx_bin" "$exporter_bin"; do
  [[ -x "$tool" ]] || { echo "monitoring: FATAL: no $tool (deploy/install_deps.sh)" >&2; exit 1; }
done
mkdir -p "$workdir/nginx"
front_door_conf "$repo/deploy/nginx/front-door.conf" "$workdir/front-door.conf" \
  "127.0.0.1:$GRPC_PORT" "127.0.0.1:$HTTP_PORT" "$workdir/nginx"
door_port=$DOOR_GRPC_PORT; door_http=$DOOR_HTTP_PORT; door_status=$DOOR_STATUS_PORT
door_exporter=$(free_port)
"$nginx_bin" -c "$workdir/front-door.conf" -e "$workdir/nginx/error.log" -g 'daemon off;' \
  >"$workdir/nginx.log" 2>&1 &
extra_pids+=($!)
"$exporter_bin" "-nginx.scrape-uri=http://127.0.0.1:$door_status/stub_status" \
  -nginx.retries=60 -nginx.retry-interval=200ms \
  "-web.listen-address=127.0.0.1:$door_exporter" >"$workdir/exporter.log" 2>&1 &
extra_pids+=($!)
echo "monitoring: front door :$door_port (HTTP :$door_http, status :$door_status)," \
  "its exporter :$door_exporter"

# Prometheus with the shipped prometheus.yml, only retargeted and sped up
# (1 s scrapes and rule evaluations), loading the same rule files. A port
# taken between the pick and the bind: try again, three times in all.
prom_url=""
for attempt in 1 2 3; do
  prom_port=$(free_port)
  "$python" "$here/live_check.py" config "$repo" "$workdir/prometheus.yml" \
    "127.0.0.1:$METRICS_PORT" "127.0.0.1:$prom_port" "127.0.0.1:$door_exporter"
  rm -rf "$workdir/tsdb"
  prometheus --config.file="$workdir/prometheus.yml" \
    --storage.tsdb.path="$workdir/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" >"$workdir/prometheus.log" 2>&1 &
  prom_pid=$!
  for ((i = 0; i < 100; i++)); do
    if curl -sf "http://127.0.0.1:$prom_port/-/ready" >/dev/null 2>&1; then
      prom_url=http://127.0.0.1:$prom_port
      break 2
    fi
    kill -0 "$prom_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$prom_pid" 2>/dev/null || true
  wait "$prom_pid" 2>/dev/null || true
  prom_pid=""
  echo "monitoring: Prometheus did not come up (attempt $attempt):" >&2
  tail -5 "$workdir/prometheus.log" | sed 's/^/  | /' >&2
done
if [[ -z "$prom_url" ]]; then
  echo "monitoring: FATAL: no Prometheus" >&2
  exit 1
fi

# --- 1. The files. ---------------------------------------------------------
# check config also loads and checks the rule files it names.
step "promtool check config deploy/prometheus/prometheus.yml" \
  promtool check config "$prom_dir/prometheus.yml"
step "promtool check rules (recording rules, alerts)" \
  promtool check rules "$prom_dir/attnserve.rules.yml" "$prom_dir/attnserve.alerts.yml"
step "promtool test rules rules_test.yml" \
  promtool test rules "$here/rules_test.yml"
# The Compose Specification's JSON schema, as vendored by check-jsonschema
# (no network): unknown keys, wrong types, bad depends_on conditions.
step "compose.yaml valid against the Compose Specification schema" \
  "$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec "$compose"
# A Compose implementation's own reading: podman-compose resolves the file
# (interpolation, relative paths) and, with --dry-run, prints the podman
# commands it would run, without needing podman.
step "podman-compose config" \
  "$venv/bin/podman-compose" --dry-run -f "$compose" config
"$venv/bin/podman-compose" --verbose --dry-run -f "$compose" up --no-build -d \
  >"$workdir/podman-compose-up.log" 2>&1 || true
step "dashboard structure, Grafana provisioning, compose wiring" \
  "$python" "$here/files_check.py" "$repo" "$workdir/podman-compose-up.log"

step "promtool check config (the test's generated config)" \
  promtool check config "$workdir/prometheus.yml"
# The door's HTTP port reaches attnserve's (KServe v2 REST): the path an
# HTTP readiness probe or load balancer takes.
door_http_ready() {
  local code
  code=$(curl -sS --max-time 2 -o /dev/null -w '%{http_code}' \
    "http://127.0.0.1:$door_http/v2/health/ready") || true
  echo "GET :$door_http/v2/health/ready through the front door: $code"
  [[ $code == 200 ]]
}
step "the front door's HTTP port reaches attnserve (/v2/health/ready 200)" door_http_ready

# --- 2. Live: load, then every expression. --------------------------------
# Wait (at most 15 s) for the first successful scrape, so the counters'
# starting values are in the TSDB before the load (rate() then sees the
# whole increase).
scraped() {
  curl -sf "$prom_url/api/v1/query" --data-urlencode 'query=up{job="attnserve"} == 1' |
    grep -q '"value"'
}
for ((i = 0; i < 150; i++)); do
  scraped && break
  sleep 0.1
done
step "Prometheus scrapes the test server" scraped

# Every RPC at once for 3 s, each closed loop. Attention carries the errors:
# its pool of 64 requests mixes 61 good ones (Lk from 8 to 64, so batches are
# ragged and pad), 2 with a keys batch that does not match the queries'
# (INVALID_ARGUMENT, a client mistake) and 1 over --max_request_elements
# (RESOURCE_EXHAUSTED, a server error; ~1/64 of attention, under the 5 %
# error alert).
# Through the front door, as clients of a deployment call.
target=127.0.0.1:$door_port
common=(--target "$target" --duration 3s --warmup 0s --output_format json)
"$attnctl" load "${common[@]}" --rpc attention --concurrency 6 --lk_range 8:64 \
  --expect_codes OK,INVALID_ARGUMENT,RESOURCE_EXHAUSTED \
  --mix '61:queries=2x1x16,keys=2x64x16,values=2x64x16;2:queries=2x1x16,keys=3x64x16,values=2x64x16;1:queries=1x8192x16,keys=1x64x16,values=1x64x16' \
  >"$workdir/load-attention.json" 2>&1 &
load_pids+=($!)
for rpc in masked-softmax batch-matmul additive-attention nadaraya-watson fit-bandwidth; do
  "$attnctl" load "${common[@]}" --rpc "$rpc" --concurrency 1 \
    >"$workdir/load-$rpc.json" 2>&1 &
  load_pids+=($!)
done
load_failed=0
for pid in "${load_pids[@]}"; do wait "$pid" || load_failed=1; done
load_pids=()
for f in "$workdir"/load-*.json; do
  echo "monitoring: $(basename "$f" .json): $(grep -o '"requests": [0-9]*, "ok": [0-9]*' "$f" || head -c 200 "$f")"
done
if ((load_failed)); then
  failed=$((failed + 1))
  echo "FAIL attnctl load exited non-zero" >&2
fi

step "live: every recording rule, alert and dashboard query has data" \
  "$python" "$here/live_check.py" serving "$repo" "$prom_url"

# --- 3. Down: the target disappears. ----------------------------------------
stop_server
step "live: server stopped -> AttnserveTargetDown's expression and pending alert" \
  "$python" "$here/live_check.py" down "$repo" "$prom_url"

echo "monitoring: $((SECONDS - started)) s"
echo "monitoring: $passed passed, $failed failed"
((failed == 0))

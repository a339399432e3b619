#!/usr/bin/env bash
# The measurement behind the KServe v2 HTTP/REST front end's library choice
# (see README.md): HTTP servers (libevent evhttp, civetweb, cpp-httplib) as
# POST echo servers under wrk, their defences probed, and JSON libraries
# (RapidJSON, simdjson, nlohmann-json) parsing and writing a 262144-float
# KServe v2 infer request.
#
#   bash bench/http_library_choice/run.sh
#
# Installs its Debian packages with apt if missing, builds into a temporary
# directory (removed at exit), prints markdown tables. About 4 minutes.
# Knobs (environment): DURATION=6 (s per wrk run), REPS=2 (runs per case;
# the table keeps the one with the most requests/s), EXTRA=1 and QUIET=0.25
# (a case none of whose runs was quiet, i.e. other tasks took <= QUIET
# cores, gets up to EXTRA more runs), SERVER_CPU=0, WRK_CPU=1,
# PORT=18480 (first of ~40 consecutive ports, one per run).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
DURATION=${DURATION:-6}
REPS=${REPS:-2}
EXTRA=${EXTRA:-1}
QUIET=${QUIET:-0.25}
SERVER_CPU=${SERVER_CPU:-0}
WRK_CPU=${WRK_CPU:-1}
PORT=${PORT:-18480}
PKGS="libevent-dev rapidjson-dev libsimdjson-dev nlohmann-json3-dev
      libcivetweb-dev libcpp-httplib-dev wrk g++ pkg-config python3"

# --- packages ---------------------------------------------------------------
missing=()
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
    missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" ||
    { $SUDO apt-get update -q &&
      $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; }
fi

# --- build ------------------------------------------------------------------
TMP=$(mktemp -d /tmp/http_library_choice.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 143' INT TERM  # (exit runs the EXIT trap)
CXX="g++ -O2 -std=c++17 -Wall -Wextra"
echo "building into $TMP ..."
builds=()
$CXX "$HERE/evhttp_echo.cc" -o "$TMP/evhttp_echo" -levent -pthread & builds+=($!)
$CXX "$HERE/civetweb_echo.cc" -o "$TMP/civetweb_echo" -lcivetweb -pthread & builds+=($!)
# shellcheck disable=SC2046
$CXX $(pkg-config --cflags cpp-httplib) "$HERE/httplib_echo.cc" \
  -o "$TMP/httplib_echo" $(pkg-config --libs cpp-httplib) -pthread & builds+=($!)
$CXX "$HERE/json_bench.cc" -o "$TMP/json_bench" -lsimdjson & builds+=($!)
for b in "${builds[@]}"; do wait "$b"; done  # set -e: a failed build stops here

# --- machine ----------------------------------------------------------------
echo
echo "## Machine"
echo
model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
fam=$(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
mod=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
avx512=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep '^avx512' | sort | tr '\n' ' ')
echo "- CPU: $model (family $fam, model $mod), $(nproc) cores online"
echo "- AVX-512: ${avx512:-none}"
echo "- load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- $(g++ --version | head -1); packages:"
for p in libevent-dev libcivetweb-dev libcpp-httplib-dev rapidjson-dev \
         libsimdjson-dev nlohmann-json3-dev wrk; do
  echo "  $p $(dpkg-query -W -f='${Version}' "$p")"
done

# --- HTTP: wrk against each echo server --------------------------------------
CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# user+nice+system ticks of every task on the machine (/proc/stat)
all_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4}' /proc/stat; }
# TcpExt ListenOverflows: SYNs dropped because an accept queue was full
listen_overflows() {
  awk '$1 == "TcpExt:" { if (!h) { for (i = 2; i <= NF; ++i) if ($i == "ListenOverflows") c = i; h = 1 } else print $c }' /proc/net/netstat
}
# CPU ticks of this shell's finished children, from a saved `times` output
child_ticks() {
  awk -v hz="$CLK_TCK" 'NR == 2 {
    t = 0
    for (i = 1; i <= 2; ++i) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
    printf "%d", t * hz }' "$1"
}

start_server() {  # name port timeout_s [cpus] [nodelay] -> SRV_PID, once ready
  local name=$1 port=$2 timeout=$3 cpus=${4:-$SERVER_CPU} nd=${5:-1} bin args
  case $name in
    evhttp-1) bin=evhttp_echo; args="$port $timeout 1 $nd" ;;
    evhttp-1big) bin=evhttp_echo; args="$port $timeout 1 $nd 1" ;;
    evhttp-2) bin=evhttp_echo; args="$port $timeout 2 $nd" ;;
    civetweb) bin=civetweb_echo; args="$port $timeout 72 $nd" ;;
    httplib) bin=httplib_echo; args="$port $timeout 72 $nd" ;;
  esac
  # shellcheck disable=SC2086
  taskset -c "$cpus" "$TMP/$bin" $args >"$TMP/$name.out" 2>"$TMP/$name.err" &
  SRV_PID=$!
  PIDS+=("$SRV_PID")
  for _ in $(seq 100); do
    grep -q ready "$TMP/$name.out" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "server $name did not start" >&2
  cat "$TMP/$name.err" >&2
  exit 1
}

stop_server() {  # name -> CONNS: the server's accepted-connection count
  # (not in a $(...) subshell: only this shell can wait for the server)
  kill -TERM "$SRV_PID"
  wait "$SRV_PID" 2>/dev/null || true
  CONNS=$(sed -n 's/^connections=//p' "$TMP/$1.err")
}

RES="$TMP/http.tsv"
: >"$RES"

bench_one() {  # name size rep nodelay: one wrk run, appends a row to $RES
  local name=$1 size=$2 rep=$3 nd=$4 c0 c1 k0 k1 w l0 l1 t0 t1 conns
  start_server "$name" "$PORT" 10 "$SERVER_CPU" "$nd"
  sleep 0.2
  c0=$(cpu_ticks "$SRV_PID")
  k0=$(all_ticks)
  l0=$(listen_overflows)
  times >"$TMP/times0"  # (in this shell: wrk's CPU shows up as a child's)
  t0=$(date +%s%N)
  BODY_BYTES=$size taskset -c "$WRK_CPU" wrk -t1 -c64 -d"${DURATION}s" \
    --timeout 5s --latency -s "$HERE/post.lua" \
    "http://127.0.0.1:$PORT/v2/models/m/infer" >"$TMP/wrk.txt" 2>&1 || true
  c1=$(cpu_ticks "$SRV_PID")
  t1=$(date +%s%N)
  times >"$TMP/times1"
  k1=$(all_ticks)
  l1=$(listen_overflows)
  w=$(( $(child_ticks "$TMP/times1") - $(child_ticks "$TMP/times0") ))
  stop_server "$name"
  conns=$CONNS
  awk -v name="$name" -v size="$size" -v rep="$rep" -v nd="$nd" \
      -v ticks=$((c1 - c0)) -v hz="$CLK_TCK" -v conns="${conns:-?}" \
      -v other=$((k1 - k0 - (c1 - c0) - w)) -v dur="$(( (t1 - t0) / 1000000 ))" \
      -v lo=$((l1 - l0)) '
    function ms(v) {
      if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0;
      if (v ~ /m$/) return v * 60000; return v * 1000 }
    /Requests\/sec:/ { rps = $2 }
    /^ +99%/ { p99 = ms($2) }
    / requests in / { n = $1 }
    /Non-2xx/ { err += $NF }
    /Socket errors:/ { gsub(/,/, ""); err += $4 + $6 + $8 + $10 }
    END {
      cpu = n ? ticks / hz / n * 1e6 : 0
      o = other / hz / (dur / 1000); if (o < 0) o = 0
      printf "%s\t%s\t%s\t%.0f\t%.2f\t%.1f\t%s\t%d\t%s\t%.2f\t%d\n", name,
             size, rep, rps, p99, cpu, conns, err, nd, o, lo }' "$TMP/wrk.txt" >>"$RES"
  tail -1 "$RES" | awk -F'\t' '{printf "  run %s %-11s %6s B nodelay=%s: %7s req/s  p99 %6s ms  cpu %6s us/req  conns %s  errors %s  listen overflows %s  other tasks: %s cores\n", $3, $1, $2, $9, $4, $5, $6, $7, $8, $11, $10}'
  PORT=$((PORT + 1))  # a fresh port per run: no TIME_WAIT interplay
}

CASES="evhttp-1 evhttp-1big evhttp-2 civetweb httplib"
SIZES="200 65536"
echo
echo "wrk: $REPS x 5 servers x 2 body sizes x ${DURATION} s with TCP_NODELAY on,"
echo "(+ up to $EXTRA more for a case whose runs were all disturbed), then"
echo "1 x 3 servers x 2 sizes with each library's default (Nagle on) ..."
for rep in $(seq "$REPS"); do
  for size in $SIZES; do
    for name in $CASES; do bench_one "$name" "$size" "$rep" 1; done
  done
done
# Other work on the machine comes in bursts; a case whose runs were all
# disturbed (other tasks took > QUIET cores) gets up to EXTRA more runs.
for extra in $(seq "$EXTRA"); do
  for size in $SIZES; do
    for name in $CASES; do
      calm=$(awk -F'\t' -v n="$name" -v s="$size" -v q="$QUIET" '
        $1 == n && $2 == s && $9 == 1 && $10 <= q { c = 1 } END { print c + 0 }' "$RES")
      if [ "$calm" = 0 ]; then
        echo "  (all runs of $name $size B disturbed: one more)"
        bench_one "$name" "$size" "$((REPS + extra))" 1
      fi
    done
  done
done
for size in $SIZES; do
  for name in evhttp-1 civetweb httplib; do bench_one "$name" "$size" 1 0; done
done

echo "load average after the wrk runs: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$RES" "$REPS" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
label = {"evhttp-1": "libevent evhttp, 1 loop thread",
         "evhttp-1big": "libevent evhttp, 1 loop thread, 256 KiB max single read/write",
         "evhttp-2": "libevent evhttp, 2 loop threads (SO_REUSEPORT)",
         "civetweb": "civetweb 1.15, 72 worker threads",
         "httplib": "cpp-httplib 0.11.4, 72-thread pool"}


def table(nd):
    print("| server | body | requests/s%s | p99 latency | server CPU per "
          "request | connections | errors | other tasks' CPU |"
          % (" (other run)" if nd == "1" else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for size in ("200", "65536"):
        for name in ("evhttp-1", "evhttp-1big", "evhttp-2", "civetweb",
                     "httplib"):
            runs = [r for r in rows
                    if r[0] == name and r[1] == size and r[8] == nd]
            if not runs:
                continue
            runs.sort(key=lambda r: -float(r[3]))
            b = runs[0]
            other = ", ".join("%.0f" % float(r[3]) for r in runs[1:])
            print("| %s | %s | %.0f%s | %.2f ms | %.1f us | %s | %s | %s cores |" % (
                label[name], "64 KiB" if size == "65536" else "200 B",
                float(b[3]), " (%s)" % other if other else "", float(b[4]),
                float(b[5]), b[6],
                b[7] + (" (%s SYNs dropped: accept queue full)" % b[10]
                        if int(b[10]) else ""), b[9]))


print()
print("## HTTP: POST echo, wrk -t1 -c64, server on 1 core, wrk on the other")
print()
print("TCP_NODELAY on in every server. Best of %s runs per row (more "
      "where every run was disturbed) by requests/s, with that run's p99 "
      "and CPU; the other runs' requests/s in brackets. CPU = server user+sys time (/proc/PID/stat) / requests "
      "answered. connections = accepted by the server (64 = keep-alive "
      "held; evhttp and civetweb also count wrk's one probe connection). "
      "other tasks' CPU = CPU time (/proc/stat user+nice+system) that tasks "
      "other than the server and wrk took during that run, in cores (of "
      "2): how disturbed the run was."
      % sys.argv[2])
print()
table("1")
print()
print("### Each library's default: TCP_NODELAY off (1 run each)")
print()
table("0")
PY

# --- HTTP: defences -----------------------------------------------------------
echo
echo "## HTTP: defences, probed (servers started with a 2 s timeout)"
echo
P0=$PORT
start_server evhttp-1 $((P0 + 0)) 2 0,1; E=$SRV_PID
start_server civetweb $((P0 + 1)) 2 0,1; C=$SRV_PID
start_server httplib $((P0 + 2)) 2 0,1; H=$SRV_PID
python3 "$HERE/probe.py" evhttp=$((P0 + 0)) civetweb=$((P0 + 1)) httplib=$((P0 + 2))
kill "$E" "$C" "$H"; wait "$E" "$C" "$H" 2>/dev/null || true

echo
echo "## HTTP: defences as the installed headers/library state them"
echo
echo "libevent 2.1.12 (/usr/include/event2/http.h): the server-wide limit setters"
echo "(no evhttp_set_max_connections: that came in 2.2.1-alpha):"
grep -hoE 'evhttp_set_(max_headers_size|max_body_size|timeout|timeout_tv|max_connections)\b' \
  /usr/include/event2/http.h | sort -u | sed 's/^/  /'
if nm -D /usr/lib/x86_64-linux-gnu/libevent-2.1.so.7 | grep -q ' T evhttp_get_request$'; then
  echo "  evhttp_get_request: exported"
else
  echo "  evhttp_get_request: NOT exported (static in http.c): no public way to hand evhttp an accepted fd"
fi
echo "civetweb 1.15 (mg_get_valid_options() defaults):"
"$TMP/civetweb_echo" --options | grep -E '^(tcp_nodelay|num_threads|max_request_size|request_timeout_ms|keep_alive_timeout_ms|enable_keep_alive|connection_queue|listen_backlog|linger_timeout_ms|throttle)=' | sed 's/^/  /'
echo "cpp-httplib 0.11.4 (/usr/include/httplib.h defaults):"
grep -E '^#define CPPHTTPLIB_(TCP_NODELAY|KEEPALIVE_TIMEOUT_SECOND|KEEPALIVE_MAX_COUNT|READ_TIMEOUT_SECOND|WRITE_TIMEOUT_SECOND|REQUEST_URI_MAX_LENGTH|HEADER_MAX_LENGTH|PAYLOAD_MAX_LENGTH|LISTEN_BACKLOG) ' \
  /usr/include/httplib.h | sed 's/^#define /  /'
grep -A3 '^#define CPPHTTPLIB_THREAD_POOL_COUNT' /usr/include/httplib.h |
  tr -s ' \n\\' ' ' | sed 's/^#define /  /'
echo

# --- JSON -----------------------------------------------------------------------
echo
echo "## JSON: KServe v2 infer request, 262144 FP32 numbers (json_bench on core $SERVER_CPU)"
echo
taskset -c "$SERVER_CPU" "$TMP/json_bench"
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

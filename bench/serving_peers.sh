#!/usr/bin/env bash
# attnserve beside Triton Inference Server, serving the same model:
# dot_product_attention (queries (B, Lq, d), keys (B, Lk, d), values (B, Lk, v)
# FP32, optional valid_lens INT32 -> output FP32), Triton's in its Python
# backend with PyTorch's torch.nn.functional.scaled_dot_product_attention
# (bench/serving_peers/model.py: valid_lens as the boolean mask the textbook's
# masked softmax means). Both are loaded by perf_analyzer over gRPC and over
# HTTP/REST (binary tensors, perf_analyzer's default) at the same concurrency,
# at the textbook's toy shape (B=1 per request, Lq=1, Lk=10, d=2, v=4) and the
# medium one (Lq=Lk=64, d=v=64): one run each, the servers alternating
# (attnserve grpc, Triton grpc, attnserve http, Triton http, per case).
# Before measuring, one request per case goes to both servers (HTTP, JSON) and
# their outputs must agree within 1e-5.
# Prints one markdown table, a line naming the CPU and the command.
# Not part of the test suite.
#
# Triton: PyPI's nvidia-pytriton 0.7.0 wheel bundles tritonserver 2.51 with its
# Python backend and stubs (see shared/FACTS.md, "Peers and the open
# network"). This script runs that bundled tritonserver binary directly on a
# model repository it lays out (config.pbtxt and model.py from
# bench/serving_peers/), the way Triton's Python backend is deployed: one
# tritonserver process and one triton_python_backend_stub process running
# model.py. (pytriton's own Python API would instead forward every request from
# a proxy model over ZeroMQ to a callable in a third process.) As pytriton
# does, the backend folder is a copy with the Python 3.11 stub put in it, the
# bundled libraries come from LD_LIBRARY_PATH, and the venv's bin/ leads PATH
# so the stub's embedded Python (Debian's libpython3.11, hence a venv made by
# Debian's /usr/bin/python3) finds the venv's torch and numpy. No endpoint is
# restricted (tritonserver's default; pytriton's Triton() restricts them unless
# given TritonSecurityConfig(restricted_endpoints=[])). Stopped by SIGINT, and
# waited for.
#
# Installs, once, cached: a venv at $PEERS_VENV (default
# /var/tmp/attnserve-peers-venv) made with /usr/bin/python3 -m venv, with
# nvidia-pytriton==0.7.0, numpy<2 and torch==2.5.1 from PyPI. PyPI's Linux
# x86_64 torch wheel depends on NVIDIA's CUDA 12.4 wheels (cuBLAS, cuDNN, NCCL,
# ...): about 5.4 GB on disk, ~3 GB downloaded, though nothing here uses a GPU
# (PyTorch's CPU-only wheels are not on PyPI). And the Debian 13 chroot with
# perf_analyzer 2.60 exactly as bench/perf_analyzer.sh makes it (the same
# lines, copied: that script has no function to source).
#
# Server CPU per inference: user + system seconds of the server's process tree
# (attnserve: its one process; Triton: tritonserver and its Python backend
# stub) from /proc, over the inferences the server itself counted
# (attnserve: attnserve_requests_total{rpc="ScaledDotProductAttention",
# code="OK"} from its metrics endpoint; Triton: the model's success count from
# its statistics endpoint), over the whole perf_analyzer run (every trial).
#
# Cores: with 2 or more CPUs, both servers run pinned to CPU $SERVER_CPUS
# (default 0; one at a time is loaded, the other idles at no CPU) with
# taskset; PIN=0 turns that off. Pinned to one CPU, attnserve sees a CPU budget
# of 1 (1 worker thread; --kernel_threads=1 is its default) and model.py uses
# 1 PyTorch thread; Triton runs one model instance (no dynamic batching, as
# attnserve's --batching is off by default). perf_analyzer is not pinned: it
# may use both CPUs (CLIENT_CPUS=1 pins it, at a risk). Pinned alone to CPU 1,
# its 65 threads (one per request in flight) starved its own measurement
# loop, which then never closed a window while requests went on: against
# attnserve (toy over HTTP, medium over both protocols) it sent ~20k requests/s
# for the whole 300 s limit, or grew ~0.5 GB/s to the memory cap
# (std::bad_alloc); with --async it did the same at the medium shape. Left on
# both CPUs, the same runs took 4-6 s and 0.1-4 GB, on a machine that other
# work was loading as well.
#
# Seen on the way, and fixed since (commit bacfdc2): attnserve's HTTP port
# left Nagle's algorithm on, so a medium reply's last 321 bytes waited for the
# client's delayed ACK (~44 ms per request with 1-8 in flight); the listener
# now sets TCP_NODELAY, which accepted sockets inherit.
#
# Measurement windows count requests (count_windows, as bench/perf_analyzer.sh
# does: time windows made perf_analyzer grow without bound on the medium
# case); perf_analyzer is capped at PA_MEMORY_CAP_GIB (default 12) of address
# space and 300 s per run.
#
# Usage: bench/serving_peers.sh [CONCURRENCY]      (default 64 in flight)
# Environment: CASES ("toy medium"), PROTOCOLS ("grpc http"),
#   TOY_REQUESTS (20000) and MEDIUM_REQUESTS (4000) per window, MAX_TRIALS (6),
#   STABILITY (30, percent), PIN (1), SERVER_CPUS (0), CLIENT_CPUS (unset),
#   PA_MEMORY_CAP_GIB (12), PA_FLAGS (more perf_analyzer flags, e.g. -v),
#   ATTNSERVE (build/server/attnserve), PEERS_VENV, CHROOT (/var/tmp/attnserve-trixie).
set -euo pipefail
cd "$(dirname "$0")/.."
concurrency="${1:-64}"
cases="${CASES:-toy medium}"
protocols="${PROTOCOLS:-grpc http}"
chroot_dir="${CHROOT:-/var/tmp/attnserve-trixie}"
server=${ATTNSERVE:-build/server/attnserve}
venv=${PEERS_VENV:-/var/tmp/attnserve-peers-venv}
pins=("nvidia-pytriton==0.7.0" "numpy<2" "torch==2.5.1")
helpers=bench/serving_peers
[[ -x "$server" ]] || { echo "build first: make build" >&2; exit 1; }

# The venv, once (re-made when the pins change).
if [[ "$(cat "$venv/.attnserve-peers-pins" 2>/dev/null)" != "${pins[*]}" ]]; then
  /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || apt-get install -y python3-venv >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "${pins[@]}" >&2
  echo "${pins[*]}" >"$venv/.attnserve-peers-pins"
fi
python="$venv/bin/python"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# perf_analyzer, in its chroot.
bash bench/perf_analyzer_chroot.sh "$chroot_dir"

# Cores.
server_pin=() client_pin=()
if [[ "${PIN:-1}" == 1 && $(nproc) -ge 2 ]]; then
  server_pin=(taskset -c "${SERVER_CPUS:-0}")
  if [[ -n "${CLIENT_CPUS:-}" ]]; then client_pin=(taskset -c "$CLIENT_CPUS"); fi
fi

# Folders: perf_analyzer's input data and CSVs in the chroot's /tmp; Triton's
# model repository, backend and logs beside.
data=$(mktemp -d -p "$chroot_dir/tmp" serving-peers.XXXXXX)
data_seen=/tmp/$(basename "$data")
work=$(mktemp -d -t attnserve-peers.XXXXXX)
attnserve_pid="" triton_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  set +e
  if [[ -n "$attnserve_pid" ]]; then
    kill -TERM "$attnserve_pid" 2>/dev/null
    wait "$attnserve_pid" 2>/dev/null
  fi
  # Triton: SIGINT, then up to 30 s to unload the model and end its stub.
  if [[ -n "$triton_pid" ]]; then
    kill -INT "$triton_pid" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$triton_pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$triton_pid" 2>/dev/null
    wait "$triton_pid" 2>/dev/null
  fi
  rm -rf "$data" "$work"
}
trap cleanup EXIT
"$python" "$helpers/peers.py" data "$data"

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ready() {  # URL SECONDS LOG
  for _ in $(seq $((2 * $2))); do
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" \
      2>/dev/null && return 0
    sleep 0.5
  done
  echo "not ready after $2 s: $1; its log:" >&2
  tail -30 "$3" >&2
  return 1
}

# attnserve.
a_grpc=$(port) a_metrics=$(port) a_http=$(port)
"${server_pin[@]}" "$server" --host=127.0.0.1 --grpc_port="$a_grpc" \
  --metrics_port="$a_metrics" --http_port="$a_http" --drain_notice_ms=0 \
  >"$work/attnserve.log" 2>&1 &
attnserve_pid=$!

# Triton: the model repository and the Python backend with its 3.11 stub.
mkdir -p "$work/models/dot_product_attention/1" "$work/backends/python"
cp "$helpers/config.pbtxt" "$work/models/dot_product_attention/"
cp "$helpers/model.py" "$work/models/dot_product_attention/1/"
cp "$site/pytriton/tritonserver/backends/python/libtriton_python.so" \
   "$site/pytriton/tritonserver/backends/python/triton_python_backend_utils.py" \
   "$site/pytriton/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub" \
   "$work/backends/python/"
t_grpc=$(port) t_metrics=$(port) t_http=$(port)
PATH="$venv/bin:$PATH" LD_LIBRARY_PATH="$site/nvidia_pytriton.libs" \
"${server_pin[@]}" "$site/pytriton/tritonserver/bin/tritonserver" \
  --model-repository="$work/models" --backend-directory="$work/backends" \
  --http-address=127.0.0.1 --http-port="$t_http" \
  --grpc-address=127.0.0.1 --grpc-port="$t_grpc" \
  --metrics-address=127.0.0.1 --metrics-port="$t_metrics" --allow-metrics=true \
  --allow-gpu-metrics=false --allow-cpu-metrics=false \
  >"$work/triton.log" 2>&1 &
triton_pid=$!

wait_ready "http://127.0.0.1:$a_http/v2/health/ready" 30 "$work/attnserve.log"
wait_ready "http://127.0.0.1:$t_http/v2/models/dot_product_attention/ready" 180 "$work/triton.log"
"$python" "$helpers/peers.py" check "$data" "127.0.0.1:$a_http" "127.0.0.1:$t_http" ||
  { echo "attnserve and Triton disagree: not measuring" >&2; exit 1; }

echo "| case | protocol | server | infer/s | p50 ms | p99 ms | server CPU µs/infer |"
echo "|---|---|---|---:|---:|---:|---:|"
failed=0
for case in $cases; do
  requests_per_window=${TOY_REQUESTS:-20000}
  [[ $case == medium ]] && requests_per_window=${MEDIUM_REQUESTS:-4000}
  for protocol in $protocols; do
    for name in attnserve triton; do
      if [[ $name == attnserve ]]; then
        pid=$attnserve_pid count=(count-attnserve "127.0.0.1:$a_metrics")
        address=127.0.0.1:$a_grpc
        [[ $protocol == http ]] && address=127.0.0.1:$a_http
      else
        pid=$triton_pid count=(count-triton "127.0.0.1:$t_http")
        address=127.0.0.1:$t_grpc
        [[ $protocol == http ]] && address=127.0.0.1:$t_http
      fi
      cpu_before=$("$python" "$helpers/peers.py" cpu "$pid")
      requests_before=$("$python" "$helpers/peers.py" "${count[@]}")
      rm -f "$data/run.csv"
      # shellcheck disable=SC2086  # PA_FLAGS is a flag list
      if ! "${client_pin[@]}" timeout 300 prlimit --as=$((${PA_MEMORY_CAP_GIB:-12} << 30)) -- \
          chroot "$chroot_dir" /opt/perf_analyzer/bin/perf_analyzer -m dot_product_attention \
          -i "$protocol" -u "$address" --input-data "$data_seen/$case.json" \
          --concurrency-range "$concurrency" --measurement-mode count_windows \
          --measurement-request-count "$requests_per_window" -f "$data_seen/run.csv" \
          --max-trials="${MAX_TRIALS:-6}" --stability-percentage="${STABILITY:-30}" \
          ${PA_FLAGS:-} >"$work/pa.log" 2>&1; then
        kept=$(mktemp -t "serving-peers-pa-$case-$protocol-$name.XXXXXX.log")
        cp "$work/pa.log" "$kept"
        echo "perf_analyzer failed for $case ($protocol, $name); its log: $kept; its last lines:" >&2
        tail -5 "$kept" >&2
        [[ $name == attnserve ]] &&
          "$python" "$helpers/peers.py" errors-attnserve "127.0.0.1:$a_metrics" >&2
        echo "| $case | $protocol | $name | failed | | | |"
        failed=1
        continue
      fi
      cpu_after=$("$python" "$helpers/peers.py" cpu "$pid")
      requests_after=$("$python" "$helpers/peers.py" "${count[@]}")
      "$python" "$helpers/peers.py" row "$data/run.csv" "$case" "$protocol" \
        "$([[ $name == triton ]] && echo "Triton (Python backend, PyTorch SDPA)" || echo attnserve)" \
        "$cpu_before" "$cpu_after" "$requests_before" "$requests_after"
    done
  done
done

echo
pinning="nothing pinned"
if [[ ${#server_pin[@]} -gt 0 ]]; then
  pinning="servers pinned to CPU ${SERVER_CPUS:-0} (taskset), perf_analyzer"
  if [[ ${#client_pin[@]} -gt 0 ]]; then pinning+=" pinned to CPU $CLIENT_CPUS"
  else pinning+=" on any CPU"; fi
fi
echo "CPU: $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) cores; $pinning;" \
  "$concurrency in flight"
settings=""
for v in CASES PROTOCOLS TOY_REQUESTS MEDIUM_REQUESTS MAX_TRIALS STABILITY PIN SERVER_CPUS \
         CLIENT_CPUS PA_MEMORY_CAP_GIB PA_FLAGS ATTNSERVE PEERS_VENV CHROOT; do
  [[ -n "${!v:-}" ]] && settings+="$v=$(printf %q "${!v}") "
done
echo "Command: ${settings}bench/serving_peers.sh $*"
exit "$failed"

#!/usr/bin/env bash
# End-to-end test of the attnserve and attnctl binaries.
#
#   tests/e2e/e2e_test.sh ATTNSERVE ATTNCTL
#
# Starts the real server on free loopback ports and, through attnctl:
#  1. waits for `attnctl health` to say SERVING (at most 100 x 0.1 s);
#  2. calls every RPC with random shapes (seed printed; E2E_SEED=N replays
#     one run) and checks exit 0 and the shape of the JSON "output";
#  3. checks bad requests: mismatched depth -> exit 2 + INVALID_ARGUMENT,
#     a request over --max_request_elements -> exit 2 + RESOURCE_EXHAUSTED;
#  4. scrapes /metrics with curl: attnserve_requests_total counts exactly the
#     calls made, and `promtool check metrics` accepts the exposition;
#  5. sends SIGTERM while a slow call (~1 s of kernel) is in flight: the call
#     must still succeed, health must stop saying SERVING, and the server
#     must exit 0 within the grace period.
# The server is always stopped (trap), whatever fails. Exit 0 when all passed.
# Needs: /usr/bin/python3, curl, promtool (Debian's prometheus package).
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

workdir=$(mktemp -d -t attnserve-e2e.XXXXXX)
slow_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  [[ -n "$slow_pid" ]] && kill "$slow_pid" 2>/dev/null
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in "$server_bin" "$attnctl"; do
  [[ -x "$tool" ]] || { echo "e2e: FATAL: no executable at $tool" >&2; exit 1; }
done
for tool in curl promtool; do
  command -v "$tool" >/dev/null ||
    { echo "e2e: FATAL: $tool not found (install Debian's curl / prometheus)" >&2; exit 1; }
done

failures=0
checks=0
pass() { checks=$((checks + 1)); echo "ok   $*"; }
fail() {
  checks=$((checks + 1)); failures=$((failures + 1))
  echo "FAIL $*" >&2
}

seed=${E2E_SEED:-$(( $(date +%s) % 100000 ))}
RANDOM=$seed
echo "e2e: seed $seed (E2E_SEED=$seed replays these shapes)"
# Random numbers come from $RANDOM in this shell, never in a $(...) subshell:
# a subshell does not advance this shell's RANDOM, so every call would repeat.
# lens N MAX: sets LENS to a comma list of N random lengths in [0, MAX].
lens() {
  local i
  LENS=""
  for ((i = 0; i < $1; i++)); do LENS+="${LENS:+,}$((RANDOM % ($2 + 1)))"; done
}

# --- 0. backend choice at start-up -------------------------------------------------
# A bad --backend, and --backend=cuda without a usable GPU, fail at start
# with exit 1 and the reason; with a GPU, cuda starts (and is stopped here).
if "$server_bin" --backend=gpu --grpc_port=0 --metrics_port=0 --http_port=0 >"$workdir/b.out" 2>&1; then
  fail "--backend=gpu started"
elif grep -q "backend must be cpu, cuda or auto" "$workdir/b.out"; then
  pass "--backend=gpu -> exit 1, naming the choices"
else
  fail "--backend=gpu: $(head -c 300 "$workdir/b.out")"
fi
# --max_model_bytes must leave room for a model.
if "$server_bin" --max_model_bytes=0 --grpc_port=0 --metrics_port=0 --http_port=0 >"$workdir/m.out" 2>&1; then
  fail "--max_model_bytes=0 started"
elif grep -q "max_model_bytes must be at least 1, got 0" "$workdir/m.out"; then
  pass "--max_model_bytes=0 -> exit 1, naming the flag"
else
  fail "--max_model_bytes=0: $(head -c 300 "$workdir/m.out")"
fi
# The CPU kernels' instruction set: a bad value names the choices; a cap is
# honoured and logged with oneDNN's own (the whole suite runs under both caps
# in the isa_* CTest variants; this checks the flag's plumbing).
if "$server_bin" --max_cpu_isa=avx9 --grpc_port=0 --metrics_port=0 --http_port=0 >"$workdir/i.out" 2>&1; then
  fail "--max_cpu_isa=avx9 started"
elif grep -q "max_cpu_isa: unknown CPU instruction set \"avx9\"; expected one of baseline, avx2" "$workdir/i.out"; then
  pass "--max_cpu_isa=avx9 -> exit 1, naming the choices"
else
  fail "--max_cpu_isa=avx9: $(head -c 300 "$workdir/i.out")"
fi
if start_server "$server_bin" "$workdir/isa.log" --backend=cpu --max_cpu_isa=baseline \
    --drain_notice_ms=0; then
  grep -q "backend 1 of 2: onednn-cpu (own kernels: baseline; oneDNN: " "$workdir/isa.log" &&
    pass "--max_cpu_isa=baseline: $(grep -o 'onednn-cpu (.*)' "$workdir/isa.log")" ||
    fail "--max_cpu_isa=baseline not logged: $(head -c 300 "$workdir/isa.log")"
  stop_server
else
  fail "--max_cpu_isa=baseline did not start"
fi
timeout -s TERM 30 "$server_bin" --backend=cuda --host=127.0.0.1 --grpc_port=0 --http_port=0 \
  --metrics_port=0 --drain_notice_ms=0 >"$workdir/c.out" 2>&1 &
cuda_pid=$!
for _ in $(seq 100); do
  grep -q "listening on" "$workdir/c.out" && break
  kill -0 "$cuda_pid" 2>/dev/null || break
  sleep 0.1
done
if grep -q "listening on" "$workdir/c.out"; then
  kill -TERM "$cuda_pid"; wait "$cuda_pid" || true
  grep -q "backend 1 of .*: cuda" "$workdir/c.out" &&
    pass "--backend=cuda: a GPU is present and serves first" ||
    fail "--backend=cuda started without the cuda backend: $(head -c 300 "$workdir/c.out")"
else
  wait "$cuda_pid"; rc=$?
  if [[ $rc == 1 ]] && grep -q "CUDA backend was asked for but cannot run" "$workdir/c.out"; then
    pass "--backend=cuda without a GPU -> exit 1: $(grep -o 'cannot run: .*' "$workdir/c.out" | head -c 120)"
  else
    fail "--backend=cuda -> exit $rc: $(head -c 300 "$workdir/c.out")"
  fi
fi

grace_ms=5000
max_elements=3200000
start_server "$server_bin" "$workdir/server.log" --kernel_threads=1 \
  --drain_notice_ms=500 --grace_period_ms=$grace_ms --max_request_elements=$max_elements ||
  { echo "e2e: FATAL: attnserve did not start" >&2; exit 1; }
target=127.0.0.1:$GRPC_PORT
echo "e2e: attnserve pid $SERVER_PID, gRPC $target, metrics :$METRICS_PORT"

ctl() { "$attnctl" --target="$target" --deadline=20s "$@"; }

# --- 1. health ---------------------------------------------------------------
serving=0
for ((i = 0; i < 100; i++)); do
  if ctl health 2>/dev/null | grep -q '"SERVING"'; then serving=1; break; fi
  sleep 0.1
done
if [[ $serving -ne 1 ]]; then
  echo "e2e: FATAL: attnctl health never said SERVING; server log:" >&2
  sed 's/^/  | /' "$workdir/server.log" >&2
  exit 1
fi
pass "health: SERVING after $i polls"
if ctl health --service=attention.v1.AttentionService | grep -q '"SERVING"'; then
  pass "health: attention.v1.AttentionService SERVING"
else
  fail "health: attention.v1.AttentionService not SERVING"
fi

# --- 2. every RPC -------------------------------------------------------------
declare -A ok_calls=()

# call RPC "EXPECTATIONS" ATTNCTL_ARGS...: one successful call.
call() {
  local rpc=$1 expect=$2 rc=0
  shift 2
  ctl "$@" --seed="$seed" >"$workdir/out.json" 2>"$workdir/err.txt" || rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "$* -> exit $rc: $(head -c 400 "$workdir/err.txt")"
    return
  fi
  ok_calls[$rpc]=$(( ${ok_calls[$rpc]:-0} + 1 ))
  # shellcheck disable=SC2086  # the expectations are separate words
  if "$py" "$here/expect.py" $expect <"$workdir/out.json"; then
    pass "$* -> $expect"
  else
    fail "$* -> $(head -c 400 "$workdir/out.json")"
  fi
}

B=$((RANDOM % 4 + 1)) Q=$((RANDOM % 9 + 1)) K=$((RANDOM % 300 + 1))
lens "$B" "$K"; l1=$LENS
lens $((B * Q)) "$K"; l2=$LENS
call MaskedSoftmax "output=${B}x${Q}x${K}" \
  masked-softmax --shape="x=${B}x${Q}x${K}" --valid_lens="$l1"
call MaskedSoftmax "output=${B}x${Q}x${K}" \
  masked-softmax --shape="x=${B}x${Q}x${K}" --encoding=raw \
  --valid_lens="$l2" --valid_lens_shape="${B}x${Q}"
call MaskedSoftmax "output=${B}x${Q}x${K}" masked-softmax --shape="x=${B}x${Q}x${K}"

n=$((RANDOM % 4 + 1)) m=$((RANDOM % 70 + 1)) k=$((RANDOM % 70 + 1)) p=$((RANDOM % 70 + 1))
call BatchMatmul "output=${n}x${m}x${p}" \
  batch-matmul --shape="a=${n}x${m}x${k},b=${n}x${k}x${p}"
call BatchMatmul "output=${n}x${m}x${p}" \
  batch-matmul --shape="a=${n}x${m}x${k},b=${n}x${k}x${p}" --precision=bf16 --encoding=raw

B=$((RANDOM % 4 + 1)) H=$((RANDOM % 4 + 1)) Lq=$((RANDOM % 40 + 1)) Lk=$((RANDOM % 300 + 1))
d=$((RANDOM % 64 + 1)) v=$((RANDOM % 64 + 1))
lens "$B" "$Lk"; l1=$LENS
lens $((B * Lq)) "$Lk"; l2=$LENS
qkv="queries=${B}x${Lq}x${d},keys=${B}x${Lk}x${d},values=${B}x${Lk}x${v}"
call ScaledDotProductAttention "output=2x1x4 weights=2x1x10" \
  attention --shape=queries=2x1x2,keys=2x10x2,values=2x10x4 --valid_lens=2,6 --return_weights
call ScaledDotProductAttention "output=${B}x${Lq}x${v} weights=${B}x${Lq}x${Lk}" \
  attention --shape="$qkv" --valid_lens="$l1" --return_weights
call ScaledDotProductAttention "output=${B}x${Lq}x${v} no:weights" \
  attention --shape="$qkv" --causal --encoding=raw --summary
call ScaledDotProductAttention "output=${B}x${Lq}x${v} weights=${B}x${Lq}x${Lk}" \
  attention --shape="$qkv" --score=gaussian --scale=0.5 --return_weights \
  --valid_lens="$l2" --valid_lens_shape="${B}x${Lq}"
call ScaledDotProductAttention "output=${B}x${Lq}x${v}" \
  attention --shape="$qkv" --precision=bf16
call ScaledDotProductAttention "output=${B}x${H}x${Lq}x${v} weights=${B}x${H}x${Lq}x${Lk}" \
  attention --shape="queries=${B}x${H}x${Lq}x${d},keys=${B}x${H}x${Lk}x${d},values=${B}x${H}x${Lk}x${v}" \
  --valid_lens="$l1" --causal --return_weights

B=$((RANDOM % 4 + 1)) Lq=$((RANDOM % 20 + 1)) Lk=$((RANDOM % 40 + 1))
qd=$((RANDOM % 24 + 1)) kd=$((RANDOM % 24 + 1)) v=$((RANDOM % 16 + 1))
lens "$B" "$Lk"; l1=$LENS
call AdditiveAttention "output=2x1x4" additive-attention
call AdditiveAttention "output=${B}x${Lq}x${v} weights=${B}x${Lq}x${Lk}" \
  additive-attention --shape="queries=${B}x${Lq}x${qd},keys=${B}x${Lk}x${kd},values=${B}x${Lk}x${v}" \
  --valid_lens="$l1" --return_weights --encoding=raw

n=$((RANDOM % 199 + 2)) mq=$((RANDOM % 100 + 1))
call NadarayaWatson "output=50 weights=50x50" nadaraya-watson --return_weights
call NadarayaWatson "output=${mq}" \
  nadaraya-watson --shape="x_train=${n},y_train=${n},x_query=${mq}" --kernel=boxcar --bandwidth=2
dx=$((RANDOM % 4 + 1)) dy=$((RANDOM % 4 + 1))
call NadarayaWatson "output=${mq}x${dy} weights=${mq}x${n}" \
  nadaraya-watson --shape="x_train=${n}x${dx},y_train=${n}x${dy},x_query=${mq}x${dx}" \
  --kernel=epanechnikov --return_weights --encoding=raw

epochs=$((RANDOM % 19 + 2))
call FitBandwidth "fit=5" fit-bandwidth
call FitBandwidth "fit=${epochs} descends" fit-bandwidth --epochs="$epochs" --learning_rate=0.05

# --- 3. bad requests ------------------------------------------------------------
# expect_error CODE TEXT ATTNCTL_ARGS...: exit 2 and "attnctl: CODE: ...TEXT".
expect_error() {
  local code=$1 text=$2 rc=0
  shift 2
  ctl "$@" >"$workdir/out.json" 2>"$workdir/err.txt" || rc=$?
  if [[ $rc -eq 2 ]] && grep -q "^attnctl: $code: .*$text" "$workdir/err.txt"; then
    pass "$* -> exit 2, $code naming '$text'"
  else
    fail "$* -> exit $rc, stderr: $(head -c 400 "$workdir/err.txt"), expected exit 2 and $code naming '$text'"
  fi
}
expect_error INVALID_ARGUMENT keys \
  attention --shape=queries=2x1x2,keys=2x10x3,values=2x10x4
expect_error INVALID_ARGUMENT valid_lens \
  attention --shape=queries=2x1x2,keys=2x10x2,values=2x10x4 --valid_lens=2,11
expect_error RESOURCE_EXHAUSTED max_request_elements \
  attention --shape=queries=1x16384x72,keys=1x16384x72,values=1x16384x72 --encoding=raw --summary

# --- 4. metrics -------------------------------------------------------------------
metrics_url=http://127.0.0.1:$METRICS_PORT/metrics
if curl -fsS --max-time 5 "$metrics_url" -o "$workdir/metrics.txt"; then
  pass "scraped $metrics_url ($(wc -l <"$workdir/metrics.txt") lines)"
  metric() { "$py" "$here/metric.py" "$workdir/metrics.txt" "$@"; }
  # check_eq WHAT GOT WANT
  check_eq() {
    if [[ "$2" == "$3" ]]; then pass "$1 = $2"; else fail "$1 = $2, expected $3"; fi
  }
  for rpc in MaskedSoftmax BatchMatmul ScaledDotProductAttention \
             AdditiveAttention NadarayaWatson FitBandwidth; do
    check_eq "attnserve_requests_total{rpc=\"$rpc\",code=\"OK\"}" \
      "$(metric attnserve_requests_total rpc=$rpc code=OK)" "${ok_calls[$rpc]:-0}"
  done
  check_eq "attnserve_requests_total{rpc=\"ScaledDotProductAttention\",code=\"INVALID_ARGUMENT\"}" \
    "$(metric attnserve_requests_total rpc=ScaledDotProductAttention code=INVALID_ARGUMENT)" 2
  check_eq "attnserve_requests_total{rpc=\"ScaledDotProductAttention\",code=\"RESOURCE_EXHAUSTED\"}" \
    "$(metric attnserve_requests_total rpc=ScaledDotProductAttention code=RESOURCE_EXHAUSTED)" 1
  check_eq "attnserve_inflight_requests (at rest)" "$(metric attnserve_inflight_requests)" 0
  # One kernel observation per BatchMatmul call, labelled by its backend.
  check_eq "attnserve_kernel_duration_seconds_count{rpc=\"BatchMatmul\"} (all backends)" \
    "$(metric attnserve_kernel_duration_seconds_count rpc=BatchMatmul)" "${ok_calls[BatchMatmul]:-0}"
  first_backend=$(grep -o "backend 1 of [0-9]*: [a-z-]*" "$workdir/server.log" | head -1 | awk '{print $5}')
  check_eq "attnserve_kernel_duration_seconds_count{rpc=\"BatchMatmul\",backend=\"$first_backend\"}" \
    "$(metric attnserve_kernel_duration_seconds_count rpc=BatchMatmul backend="$first_backend")" "${ok_calls[BatchMatmul]:-0}"
  if promtool check metrics <"$workdir/metrics.txt" >"$workdir/promtool.txt" 2>&1; then
    pass "promtool check metrics: clean"
  else
    fail "promtool check metrics rejected the exposition:"
    sed 's/^/  | /' "$workdir/promtool.txt" >&2
  fi
else
  fail "could not scrape $metrics_url"
fi

# --- 4b. load's exit status follows --expect_codes ---------------------------------
# (after the exact metric counts above, which these calls would change)
bad_load=(load --rpc=attention --shape=queries=2x1x2,keys=2x10x3,values=2x10x4
  --requests=5 --warmup=0s --duration=inf)
rc=0
ctl "${bad_load[@]}" >"$workdir/load.txt" 2>"$workdir/load.err" || rc=$?
if [[ $rc -eq 3 ]] && grep -q "outside --expect_codes=OK: INVALID_ARGUMENT 5" "$workdir/load.err"; then
  pass "load with failing requests -> exit 3 naming INVALID_ARGUMENT"
else
  fail "load with failing requests -> exit $rc: $(head -c 300 "$workdir/load.err")"
fi
rc=0
ctl "${bad_load[@]}" --expect_codes=INVALID_ARGUMENT >"$workdir/load.txt" 2>"$workdir/load.err" || rc=$?
[[ $rc -eq 0 ]] && pass "load --expect_codes=INVALID_ARGUMENT -> exit 0" ||
  fail "load --expect_codes=INVALID_ARGUMENT -> exit $rc: $(head -c 300 "$workdir/load.err")"

# --- 5. graceful drain ------------------------------------------------------------------
# ~1 s of kernel on one thread (--kernel_threads=1), on any machine and in
# any build. A fixed shape (it was 16384 queries) took from ~1 s to past the
# 5 s grace period depending on the CPU, the load and the build (the
# sanitizer builds of tests/sanitizers run the kernel several times slower),
# and the call was then cancelled. So a probe of 1024 queries against the
# same 16384 keys times the kernel (linear in the queries), and the slow
# call takes as many queries as fit in ~1 s (64 to 16384).
probe="queries=1x1024x64,keys=1x16384x64,values=1x16384x64"
probe_s=$(ctl attention --shape="$probe" --encoding=raw --summary --deadline=60s 2>/dev/null |
  "$py" -c 'import json, sys; print(json.load(sys.stdin)["info"]["kernel_seconds"])' 2>/dev/null)
if [[ -z "$probe_s" ]]; then
  fail "drain: the probe call (queries=1x1024x64) failed"
  probe_s=0.0625
fi
slow_q=$(awk -v t="$probe_s" 'BEGIN { q = int(1024 * 1.0 / (t > 0 ? t : 1e-9));
  print (q < 64 ? 64 : (q > 16384 ? 16384 : q)) }')
echo "e2e: drain: probe kernel ${probe_s} s for 1024 queries; the slow call takes $slow_q"
slow="queries=1x${slow_q}x64,keys=1x16384x64,values=1x16384x64"
ctl attention --shape="$slow" --encoding=raw --summary --deadline=30s \
  >"$workdir/slow.json" 2>"$workdir/slow.err" &
slow_pid=$!
inflight=0
for ((i = 0; i < 200; i++)); do
  curl -fsS --max-time 1 "$metrics_url" -o "$workdir/m.txt" 2>/dev/null &&
    inflight=$("$py" "$here/metric.py" "$workdir/m.txt" attnserve_inflight_requests)
  [[ "$inflight" == 1 ]] && break
  sleep 0.02
done
if [[ "$inflight" != 1 ]]; then
  fail "drain: the slow call never showed in attnserve_inflight_requests"
fi
sigterm_at=$(date +%s.%N)
kill -TERM "$SERVER_PID"

# During --drain_notice_ms (500 here) the server still answers, and health
# Check must say NOT_SERVING (attnctl exits 1).
sleep 0.1
rc=0
ctl health --deadline=2s >"$workdir/h.json" 2>"$workdir/h.err" || rc=$?
if [[ $rc -eq 1 ]] && grep -q '"NOT_SERVING"' "$workdir/h.json"; then
  pass "drain: health exit $rc: $(cat "$workdir/h.json" "$workdir/h.err" | head -c 200)"
else
  fail "drain: health did not answer NOT_SERVING after SIGTERM (exit $rc): $(cat "$workdir/h.json" "$workdir/h.err" | head -c 200)"
fi

rc=0
wait "$slow_pid" || rc=$?
slow_pid=""
slow_done=$(date +%s.%N)
if [[ $rc -eq 0 ]] && "$py" "$here/expect.py" "output=1x${slow_q}x64" <"$workdir/slow.json"; then
  pass "drain: the in-flight call completed ($(awk "BEGIN{printf \"%.2f\", $slow_done - $sigterm_at}") s after SIGTERM)"
else
  fail "drain: the in-flight call failed: exit $rc: $(head -c 400 "$workdir/slow.err")"
fi

# The server must exit 0 within the grace period (plus 3 s for teardown).
for ((i = 0; i < (grace_ms / 100 + 30); i++)); do
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$SERVER_PID" 2>/dev/null; then
  fail "drain: attnserve still running $((grace_ms / 1000 + 3)) s after SIGTERM"
else
  rc=0
  wait "$SERVER_PID" || rc=$?
  exited=$(date +%s.%N)
  SERVER_PID=""
  took=$(awk "BEGIN{printf \"%.2f\", $exited - $sigterm_at}")
  if [[ $rc -eq 0 ]]; then
    pass "drain: attnserve exited 0, $took s after SIGTERM (grace ${grace_ms} ms)"
  else
    fail "drain: attnserve exited with status $rc ($took s after SIGTERM)"
  fi
fi

if [[ $failures -ne 0 ]]; then
  echo "e2e: server log:" >&2
  sed 's/^/  | /' "$workdir/server.log" >&2
fi
echo "e2e: $((checks - failures)) passed, $failures failed (seed $seed)"
[[ $failures -eq 0 ]]

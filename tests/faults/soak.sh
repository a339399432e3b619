#!/usr/bin/env bash
# shellcheck disable=SC2015  # pass and fail return 0: `A && pass || fail` is if-else
# A soak of the real attnserve: random shapes up to the limits, for a while.
#
#   tests/faults/soak.sh [--duration=600] [--round=30] [--interval=2]
#                        [--warmup=120] [ATTNSERVE ATTNCTL]
#
# ATTNSERVE / ATTNCTL: the binaries (default: the env vars ATTNSERVE and
# ATTNCTL, else build/server/attnserve and build/client/attnctl).
# SOAK_SEED=N replays the shapes (the seed is printed).
#
# Starts one attnserve with --max_request_elements=2^22,
# --max_message_bytes=32 MiB, --max_queue=64 (and, where the server has
# them, --max_inflight_bytes=256 MiB, --grpc_memory_quota_bytes=128 MiB,
# --grpc_max_concurrent_streams=32), then for --duration seconds runs rounds
# of --round seconds, each with four concurrent `attnctl load`s of freshly
# drawn shapes:
#  - attention, 4 in flight: B, [H,] Lq, d, v drawn, --lk_range up to ~1.1x
#    the key length at the element limit (so ~1 request in 10 is over it:
#    RESOURCE_EXHAUSTED, intended), --valid_lens_range, sometimes causal,
#    return_weights, bf16;
#  - masked-softmax, 2 in flight: --lk_range likewise up to ~1.1x the limit;
#  - batch-matmul, 2 in flight: a --mix of three shapes within the limit;
#  - nadaraya-watson, 1 in flight.
# Every load allows OK and RESOURCE_EXHAUSTED only (--expect_codes). RSS
# (/proc/PID/status VmRSS) is sampled every --interval seconds.
# Passes when: no load saw another code, the server never died and exits 0 on
# SIGTERM, peak RSS <= idle + 2 x max_inflight_bytes + quota + 128 MiB, and
# RSS is flat after --warmup seconds: the peak of the last third of the
# remaining time is at most max(10%, 64 MiB) above the peak of its first third.
# Exit 0 when all passed; the RSS samples and per-round codes are printed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=/usr/bin/python3

duration=600
round=30
interval=2
warmup=120
positional=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --duration=*) duration=${1#--duration=} ;;
    --round=*) round=${1#--round=} ;;
    --interval=*) interval=${1#--interval=} ;;
    --warmup=*) warmup=${1#--warmup=} ;;
    -h|--help) sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "soak: unknown option $1" >&2; exit 64 ;;
    *) positional+=("$1") ;;
  esac
  shift
done
if [[ ${#positional[@]} -ne 0 && ${#positional[@]} -ne 2 ]]; then
  echo "usage: $0 [--duration=S] [--round=S] [--interval=S] [--warmup=S] [ATTNSERVE ATTNCTL]" >&2
  exit 64
fi
[[ $warmup -lt $duration ]] || { echo "soak: --warmup must be below --duration" >&2; exit 64; }

# shellcheck source=tests/lib/server.sh
source "$repo/tests/lib/server.sh"
resolve_binaries soak "$repo" "${positional[@]}"

workdir=$(mktemp -d -t attnserve-soak.XXXXXX)
load_pids=()
sampler_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local pid
  for pid in "${load_pids[@]}" $sampler_pid; do kill "$pid" 2>/dev/null; done
  stop_server
  if [[ -n "${SOAK_KEEP:-}" ]]; then echo "soak: kept $workdir"; else rm -rf "$workdir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
checks=0
pass() { checks=$((checks + 1)); echo "ok   $*"; }
fail() { checks=$((checks + 1)); failures=$((failures + 1)); echo "FAIL $*" >&2; }
now() { date +%s.%N; }
mib() { awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }'; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }

seed=${SOAK_SEED:-$(( $(date +%s) % 100000 ))}
RANDOM=$seed
echo "soak: seed $seed (SOAK_SEED=$seed replays these shapes); ${duration} s in rounds of ${round} s"
# Random numbers come from $RANDOM in this shell only (a subshell would not
# advance it). pick A B: sets R to a number in [A, B].
pick() { R=$(( $1 + (RANDOM * 32768 + RANDOM) % ($2 - $1 + 1) )); }
choose() { local a=("$@"); R=${a[$((RANDOM % ${#a[@]}))]}; }

max_elements=$((1 << 22))
max_msg=$((32 << 20))
inflight_bytes=$((256 << 20))
quota=$((128 << 20))
helpfull=$("$server_bin" --helpfull 2>&1)
flags=(--max_queue=64 "--max_request_elements=$max_elements" "--max_message_bytes=$max_msg"
  --kernel_threads=1 --drain_notice_ms=0)
want_flag() {
  if grep -q -e "--$1 " <<<"$helpfull"; then flags+=("--$1=$2"); else
    echo "     (attnserve has no --$1: left out; the RSS bound assumes $2)"; fi
}
want_flag max_inflight_bytes $inflight_bytes
want_flag grpc_memory_quota_bytes $quota
want_flag grpc_max_concurrent_streams 32
echo "soak: attnserve ${flags[*]}"
start_server "$server_bin" "$workdir/server.log" "${flags[@]}" ||
  { echo "soak: FATAL: attnserve did not start" >&2; exit 1; }
target=127.0.0.1:$GRPC_PORT
for ((i = 0; i < 200; i++)); do
  "$attnctl" --target="$target" health --deadline=1s 2>/dev/null | grep -q '"SERVING"' && break
  sleep 0.1
done
sleep 1
idle=$(rss_kb "$SERVER_PID")
bound=$((idle + 2 * inflight_bytes / 1024 + quota / 1024 + 128 * 1024))
echo "soak: attnserve pid $SERVER_PID; idle RSS $(mib "$idle") MiB; bound $(mib "$bound") MiB"

start=$(now)
(
  while kb=$(rss_kb "$SERVER_PID") && [[ -n "$kb" ]]; do
    echo "$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') $kb"
    sleep "$interval"
  done
) >"$workdir/rss.txt" &
sampler_pid=$!

# load NAME ARGS...: one attnctl load in the background for this round.
load() {
  local name=$1
  shift
  "$attnctl" --target="$target" load --output_format=json --duration="${round}s" \
    --warmup=0s --deadline=30s --expect_codes=OK,RESOURCE_EXHAUSTED \
    --max_message_bytes=$max_msg "$@" >"$workdir/$name.json" 2>"$workdir/$name.err" &
  load_pids+=($!)
  names+=("$name")
  echo "     $name: $*" >>"$workdir/shapes.txt"
}

declare -A code_total=()
rounds=$(( (duration + round - 1) / round ))
for ((r = 1; r <= rounds; r++)); do
  load_pids=()
  names=()
  echo "round $r:" >>"$workdir/shapes.txt"
  # Attention: B, [H,] Lq, d, v; Lk up to ~1.1x the element limit.
  choose 1 2 4 8; B=$R; pick 1 256; Lq=$R; choose 16 32 64 128; d=$R; choose 16 32 64 128; v=$R
  H=1; (( RANDOM % 3 == 0 )) && { choose 2 4 8; H=$R; }
  lk_limit=$(( (max_elements / (B * H) - Lq * d) / (d + v) ))
  if [[ $lk_limit -lt 8 ]]; then Lq=1; lk_limit=$(( (max_elements / (B * H) - d) / (d + v) )); fi
  lk_hi=$(( lk_limit * 11 / 10 ))
  if [[ $H -gt 1 ]]; then
    qkv="queries=${B}x${H}x${Lq}x${d},keys=${B}x${H}x8x${d},values=${B}x${H}x8x${v}"
  else
    qkv="queries=${B}x${Lq}x${d},keys=${B}x8x${d},values=${B}x8x${v}"
  fi
  extra=()
  (( RANDOM % 3 == 0 )) && extra+=(--causal)
  (( RANDOM % 4 == 0 )) && extra+=(--precision=bf16)
  # The weights come back only while they fit the message limit.
  (( RANDOM % 3 == 0 && B * H * Lq * lk_hi * 4 < max_msg / 2 )) && extra+=(--return_weights)
  (( RANDOM % 2 == 0 )) && extra+=("--valid_lens_range=0:$lk_hi")
  load attention --rpc=attention --shape="$qkv" --lk_range="1:$lk_hi" --encoding=raw \
    --concurrency=4 --pool_size=16 --seed=$((seed + r)) "${extra[@]}"
  # Masked softmax: x (B, Q, K), K up to ~1.1x the limit.
  choose 1 2 4 8; B=$R; pick 1 128; Q=$R
  k_hi=$(( max_elements * 11 / (10 * B * Q) ))
  load masked-softmax --rpc=masked-softmax --shape="x=${B}x${Q}x8" --lk_range="1:$k_hi" \
    --valid_lens_range="0:$k_hi" --encoding=raw --concurrency=2 --pool_size=16 --seed=$((seed + r))
  # Batch matmul: three shapes within the limit.
  mix=""
  for _ in 1 2 3; do
    choose 1 2 4 8 16; n=$R; pick 1 512; m=$R; pick 1 512; k=$R; pick 1 512; p=$R
    while (( n * (m * k + k * p) > max_elements || n * m * p * 4 > max_msg / 2 )); do
      m=$(( (m + 1) / 2 )); k=$(( (k + 1) / 2 ))
    done
    mix+="${mix:+;}a=${n}x${m}x${k},b=${n}x${k}x${p}"
  done
  load batch-matmul --rpc=batch-matmul --mix="$mix" --encoding=raw --concurrency=2 \
    --pool_size=12 --seed=$((seed + r))
  # Nadaraya-Watson.
  pick 2 4096; nt=$R; pick 1 4096; mq=$R
  load nadaraya-watson --rpc=nadaraya-watson --shape="x_train=${nt},y_train=${nt},x_query=${mq}" \
    --encoding=raw --concurrency=1 --pool_size=4 --seed=$((seed + r))

  line="round $r/$rounds:"
  for i in "${!load_pids[@]}"; do
    rc=0
    wait "${load_pids[$i]}" || rc=$?
    f=$workdir/${names[$i]}.json
    summary=$("$py" - "$f" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception:
    print("no report"); sys.exit()
codes = dict(d.get("errors") or {})
codes["OK"] = d.get("ok", 0)
print(" ".join("%s=%d" % kv for kv in sorted(codes.items())))
EOF
)
    for kv in $summary; do
      [[ $kv == *=* ]] || continue
      code_total[${kv%%=*}]=$(( ${code_total[${kv%%=*}]:-0} + ${kv#*=} ))
    done
    line+=" ${names[$i]} [$summary]"
    if [[ $rc -ne 0 ]]; then
      fail "round $r: ${names[$i]} exit $rc: $(head -c 300 "$workdir/${names[$i]}.err")" \
        "(shapes: $(grep -A4 "^round $r:" "$workdir/shapes.txt" | grep "${names[$i]}:" | head -1))"
    fi
  done
  echo "$line; RSS $(mib "$(rss_kb "$SERVER_PID")") MiB"
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    fail "attnserve died in round $r; log tail:"
    tail -5 "$workdir/server.log" | sed 's/^/  | /' >&2
    break
  fi
done

kill "$sampler_pid" 2>/dev/null; wait "$sampler_pid" 2>/dev/null; sampler_pid=""
totals=""
for code in "${!code_total[@]}"; do totals+=" $code=${code_total[$code]}"; done
echo "soak: codes over all rounds:$totals"

# RSS: peak, and flat after the warm-up.
read -r peak w_end first last n_after <<<"$(awk -v w="$warmup" '
  { t[NR] = $1; k[NR] = $2; if ($2 > peak) peak = $2; if ($1 <= w) wend = $2; end = $1 }
  END {
    span = end - w; n = 0
    for (i = 1; i <= NR; i++) {
      if (t[i] <= w) continue
      n++
      if (t[i] <= w + span / 3 && k[i] > first) first = k[i]
      if (t[i] >= end - span / 3 && k[i] > last) last = k[i]
    }
    print peak + 0, wend + 0, first + 0, last + 0, n
  }' "$workdir/rss.txt")"
echo "soak: RSS samples every ${interval} s (MiB):"
awk '{ printf "%s%.0f", (NR % 20 == 1 ? (NR > 1 ? "\n  " : "  ") : " "), $2 / 1024 } END { print "" }' "$workdir/rss.txt"
echo "soak: RSS idle $(mib "$idle") MiB, at the warm-up's end $(mib "$w_end") MiB," \
  "peak $(mib "$peak") MiB; after the warm-up: first third's peak $(mib "$first") MiB," \
  "last third's $(mib "$last") MiB ($n_after samples)"
[[ $peak -le $bound ]] && pass "peak RSS $(mib "$peak") MiB <= bound $(mib "$bound") MiB" ||
  fail "peak RSS $(mib "$peak") MiB > bound $(mib "$bound") MiB (idle + 2 x max_inflight_bytes + quota + 128 MiB)"
allowed=$(awk -v f="$first" 'BEGIN { a = f * 1.10; b = f + 65536; printf "%d", (a > b ? a : b) }')
if [[ $n_after -lt 6 ]]; then
  fail "too few RSS samples after the warm-up ($n_after) to judge flatness"
elif [[ $last -le $allowed ]]; then
  pass "RSS flat after the warm-up: last third's peak $(mib "$last") MiB <= $(mib "$allowed") MiB"
else
  fail "RSS grew after the warm-up: last third's peak $(mib "$last") MiB > $(mib "$allowed") MiB (first third's $(mib "$first") MiB + max(10%, 64 MiB))"
fi

if kill -0 "$SERVER_PID" 2>/dev/null; then
  kill -TERM "$SERVER_PID"
  for ((i = 0; i < 300; i++)); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  rc=0
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    fail "attnserve still running 30 s after SIGTERM"
  else
    wait "$SERVER_PID" || rc=$?
    SERVER_PID=""
    [[ $rc -eq 0 ]] && pass "attnserve exited 0 on SIGTERM" || fail "attnserve exited $rc on SIGTERM"
  fi
fi
echo "soak: $((checks - failures)) passed, $failures failed (seed $seed)"
[[ $failures -eq 0 ]]

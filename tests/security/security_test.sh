#!/usr/bin/env bash
# End-to-end: TLS, mutual TLS and bearer tokens, with the real attnserve and
# attnctl. A throw-away CA and certificates are made with openssl in a temp
# directory (nothing secret is committed):
#  - TLS: a plaintext client is refused; a client trusting the CA is served;
#    a client trusting another CA is refused;
#  - mutual TLS: no client certificate, or one from another CA, is refused;
#    one from the CA is served;
#  - tokens (over TLS): no token and a wrong token get UNAUTHENTICATED and are
#    counted by reason; a good token is served; health checks need none;
#    save_as needs the save_as permission (PERMISSION_DENIED otherwise),
#    AppendMemory and EvictMemory the append permission (or model_control),
#    and
#    KServe RepositoryModelLoad/Unload the model_control permission (checked
#    with tritonclient's generated stubs from VENV); an
#    edit of the token file takes effect within seconds, and so does SIGHUP;
#    no token ever appears in the server's log;
#  - bad security flags exit 1 naming the flag.
#
#   tests/security/security_test.sh ATTNSERVE ATTNCTL VENV
#
# VENV: the KServe test's virtual environment (tests/kserve/requirements.txt;
# made here if missing), for the model_control checks.
set -uo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 ATTNSERVE ATTNCTL VENV" >&2
  exit 64
fi
server_bin=$(realpath "$1")
attnctl=$(realpath "$2")
venv=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
source "$repo/tests/lib/server.sh"
source "$repo/tests/lib/venv.sh"

workdir=$(mktemp -d -t attnserve-security.XXXXXX)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# --- a throw-away PKI ---------------------------------------------------------
pki=$workdir/pki
mkdir -p "$pki"
ossl() { openssl "$@" >>"$pki/openssl.log" 2>&1 || { echo "security: FATAL: openssl $*" >&2; cat "$pki/openssl.log" >&2; exit 1; }; }
# make_ca NAME
make_ca() {
  ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$1" \
    -keyout "$pki/$1.key" -out "$pki/$1.crt"
}
# issue CA NAME EXTENSIONS: a certificate for NAME signed by CA.
issue() {
  ossl req -newkey rsa:2048 -nodes -subj "/CN=$2" \
    -keyout "$pki/$2.key" -out "$pki/$2.csr"
  printf '%s\n' "$3" >"$pki/$2.ext"
  ossl x509 -req -in "$pki/$2.csr" -CA "$pki/$1.crt" -CAkey "$pki/$1.key" \
    -CAcreateserial -days 2 -extfile "$pki/$2.ext" -out "$pki/$2.crt"
}
make_ca ca
make_ca other-ca
issue ca server "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
issue ca client "extendedKeyUsage=clientAuth"
issue other-ca stranger "extendedKeyUsage=clientAuth"

token_plain=$(openssl rand -hex 24)
token_saver=$(openssl rand -hex 24)
token_new=$(openssl rand -hex 24)
token_controller=$(openssl rand -hex 24)
token_appender=$(openssl rand -hex 24)
printf '# test tokens\n%s\n%s save_as\n%s model_control\n%s append\n' \
  "$token_plain" "$token_saver" "$token_controller" "$token_appender" \
  >"$workdir/tokens"
cp -r "$repo/deploy/models" "$workdir/models"

ctl() { "$attnctl" --target="127.0.0.1:$GRPC_PORT" --deadline=10s "$@"; }
# expect_ok NAME ARGS...: the call succeeds.
expect_ok() {
  local name=$1
  shift
  if ctl "$@" >"$workdir/out" 2>"$workdir/err"; then
    pass "$name"
  else
    fail "$name: $(head -c 300 "$workdir/err")"
  fi
}
# expect_refused NAME PATTERN ARGS...: the call fails with PATTERN on stderr.
expect_refused() {
  local name=$1 pattern=$2
  shift 2
  if ctl "$@" >"$workdir/out" 2>"$workdir/err"; then
    fail "$name: succeeded"
  elif grep -qE "$pattern" "$workdir/err"; then
    pass "$name: $(head -c 140 "$workdir/err")"
  else
    fail "$name: wanted /$pattern/, got $(head -c 300 "$workdir/err")"
  fi
}
metric() {
  curl -fsS --max-time 2 "http://127.0.0.1:$METRICS_PORT/metrics" -o "$workdir/m.txt" &&
    "$py" "$repo/tests/e2e/metric.py" "$workdir/m.txt" "$@"
}
call=(attention --shape queries=2x1x2,keys=2x10x2,values=2x10x4 --summary)

# --- 1. bad flags ----------------------------------------------------------------
# http_code ARGS...: curl's HTTP status for a request to the HTTP port
# (000 when the connection or the handshake failed).
http_code() {
  curl -s -o "$workdir/http.body" -w '%{http_code}' --max-time 10 "$@" || true
}
# expect_http NAME WANT ARGS...: the HTTP port answers status WANT.
expect_http() {
  local name=$1 want=$2 got
  shift 2
  got=$(http_code "$@")
  [[ "$got" == "$want" ]] && pass "$name" ||
    fail "$name: HTTP $got, want $want: $(head -c 300 "$workdir/http.body" 2>/dev/null)"
}
infer_body='{"inputs":[{"name":"X","shape":[1,1,2],"datatype":"FP32","data":[1,2]}]}'

bad_flags() {
  local pattern=$1
  shift
  if "$server_bin" --host=127.0.0.1 --grpc_port=0 --metrics_port=0 --http_port=0 "$@" \
      >"$workdir/bad.out" 2>&1; then
    fail "attnserve $* started"
  elif grep -q -- "$pattern" "$workdir/bad.out"; then
    pass "attnserve $* -> exit 1: $(grep -o -- "$pattern.*" "$workdir/bad.out" | head -c 100)"
  else
    fail "attnserve $*: $(head -c 300 "$workdir/bad.out")"
  fi
}
bad_flags "--auth_tokens_file needs --tls_cert" --auth_tokens_file="$workdir/tokens"
bad_flags "--tls_cert and --tls_key go together" --tls_cert="$pki/server.crt"
bad_flags "--tls_client_ca needs --tls_cert" --tls_client_ca="$pki/ca.crt"
bad_flags "not a PEM file" --tls_cert="$workdir/tokens" --tls_key="$pki/server.key"
printf 'short\n' >"$workdir/bad_tokens"
bad_flags "line 1: a token must be at least 16" --tls_cert="$pki/server.crt" \
  --tls_key="$pki/server.key" --auth_tokens_file="$workdir/bad_tokens"

# --- 2. TLS ------------------------------------------------------------------------
start_server "$server_bin" "$workdir/tls.log" --drain_notice_ms=0 \
  --tls_cert="$pki/server.crt" --tls_key="$pki/server.key" ||
  { echo "security: FATAL: TLS server did not start" >&2; exit 1; }
grep -q "gRPC transport: TLS" "$workdir/tls.log" && pass "start-up says TLS" ||
  fail "start-up does not say TLS: $(head -c 300 "$workdir/tls.log")"
expect_refused "TLS: a plaintext client is refused" "UNAVAILABLE" "${call[@]}"
expect_ok "TLS: a client trusting the CA is served" --ca="$pki/ca.crt" "${call[@]}"
expect_refused "TLS: a client trusting another CA is refused" "UNAVAILABLE" \
  --ca="$pki/other-ca.crt" "${call[@]}"
https=https://127.0.0.1:$HTTP_PORT
expect_http "TLS over HTTP: a plaintext client is refused" 000 \
  "http://127.0.0.1:$HTTP_PORT/v2/health/ready"
expect_http "TLS over HTTP: a client trusting the CA is served" 200 \
  --cacert "$pki/ca.crt" -X POST -d "$infer_body" "$https/v2/models/masked_softmax/infer"
expect_http "TLS over HTTP: a client trusting another CA is refused" 000 \
  --cacert "$pki/other-ca.crt" "$https/v2/health/ready"
stop_server

# --- 3. mutual TLS -----------------------------------------------------------------
start_server "$server_bin" "$workdir/mtls.log" --drain_notice_ms=0 \
  --tls_cert="$pki/server.crt" --tls_key="$pki/server.key" \
  --tls_client_ca="$pki/ca.crt" ||
  { echo "security: FATAL: mTLS server did not start" >&2; exit 1; }
expect_refused "mTLS: no client certificate is refused" "UNAVAILABLE" \
  --ca="$pki/ca.crt" "${call[@]}"
expect_refused "mTLS: a client certificate from another CA is refused" "UNAVAILABLE" \
  --ca="$pki/ca.crt" --cert="$pki/stranger.crt" --key="$pki/stranger.key" "${call[@]}"
expect_ok "mTLS: a client certificate from the CA is served" \
  --ca="$pki/ca.crt" --cert="$pki/client.crt" --key="$pki/client.key" "${call[@]}"
https=https://127.0.0.1:$HTTP_PORT
expect_http "mTLS over HTTP: no client certificate is refused" 000 \
  --cacert "$pki/ca.crt" "$https/v2/health/ready"
expect_http "mTLS over HTTP: a certificate from another CA is refused" 000 \
  --cacert "$pki/ca.crt" --cert "$pki/stranger.crt" --key "$pki/stranger.key" \
  "$https/v2/health/ready"
expect_http "mTLS over HTTP: a certificate from the CA is served" 200 \
  --cacert "$pki/ca.crt" --cert "$pki/client.crt" --key "$pki/client.key" \
  -X POST -d "$infer_body" "$https/v2/models/masked_softmax/infer"
stop_server

# --- 4. tokens ---------------------------------------------------------------------
start_server "$server_bin" "$workdir/tokens.log" --drain_notice_ms=0 \
  --tls_cert="$pki/server.crt" --tls_key="$pki/server.key" \
  --auth_tokens_file="$workdir/tokens" --model_repository="$workdir/models" \
  --model_control_mode=explicit ||
  { echo "security: FATAL: token server did not start" >&2; exit 1; }
tls=(--ca="$pki/ca.crt")
expect_refused "tokens: no token -> UNAUTHENTICATED" "UNAUTHENTICATED: missing token" \
  "${tls[@]}" "${call[@]}"
expect_refused "tokens: a wrong token -> UNAUTHENTICATED" "UNAUTHENTICATED: invalid token" \
  "${tls[@]}" --token="$token_new" "${call[@]}"
expect_ok "tokens: a good token is served" "${tls[@]}" --token="$token_plain" "${call[@]}"
expect_ok "tokens: health checks need no token" "${tls[@]}" health
https=https://127.0.0.1:$HTTP_PORT
infer_url=$https/v2/models/masked_softmax/infer
expect_http "tokens over HTTP: no token -> 401" 401 --cacert "$pki/ca.crt" \
  -X POST -d "$infer_body" "$infer_url"
grep -q "missing bearer token" "$workdir/http.body" &&
  pass "tokens over HTTP: the 401 says the token is missing" ||
  fail "tokens over HTTP: 401 body $(head -c 200 "$workdir/http.body")"
expect_http "tokens over HTTP: a wrong token -> 401" 401 --cacert "$pki/ca.crt" \
  -H "Authorization: Bearer $token_new" -X POST -d "$infer_body" "$infer_url"
expect_http "tokens over HTTP: a good token is served" 200 --cacert "$pki/ca.crt" \
  -H "Authorization: Bearer $token_plain" -X POST -d "$infer_body" "$infer_url"
expect_http "tokens over HTTP: metadata needs a token too" 401 \
  --cacert "$pki/ca.crt" "$https/v2/models/masked_softmax"
expect_http "tokens over HTTP: health needs no token" 200 --cacert "$pki/ca.crt" \
  "$https/v2/health/ready"
expect_http "tokens over HTTP: unload by a plain token -> 403" 403 \
  --cacert "$pki/ca.crt" -H "Authorization: Bearer $token_plain" -X POST \
  "$https/v2/repository/models/additive_attention/unload"
expect_http "tokens over HTTP: load by a model_control token -> 200" 200 \
  --cacert "$pki/ca.crt" -H "Authorization: Bearer $token_controller" -X POST \
  "$https/v2/repository/models/additive_attention/load"
# An upload (a load with config and file:weights.safetensors) is a load: a
# token without model_control is refused before anything is written.
printf '{"parameters": {"config": "{\\"backend\\": \\"additive_attention\\"}", "file:weights.safetensors": "%s"}}' \
  "$(base64 -w0 "$repo/deploy/models/additive_attention/weights.safetensors")" \
  >"$workdir/upload.json"
expect_http "tokens over HTTP: an upload by a save_as token -> 403" 403 \
  --cacert "$pki/ca.crt" -H "Authorization: Bearer $token_saver" -X POST \
  --data-binary "@$workdir/upload.json" \
  "$https/v2/repository/models/uploaded_by_test/load"
[[ ! -e "$workdir/models/uploaded_by_test" ]] &&
  pass "the refused upload wrote nothing" ||
  fail "the refused upload wrote $workdir/models/uploaded_by_test"
expect_http "tokens over HTTP: an upload by a model_control token -> 200" 200 \
  --cacert "$pki/ca.crt" -H "Authorization: Bearer $token_controller" -X POST \
  --data-binary "@$workdir/upload.json" \
  "$https/v2/repository/models/uploaded_by_test/load"
[[ -f "$workdir/models/uploaded_by_test/weights.safetensors" ]] &&
  pass "the permitted upload wrote the model" ||
  fail "the permitted upload wrote nothing under $workdir/models"
missing=$(metric attnserve_unauthenticated_requests_total reason=missing_token)
invalid=$(metric attnserve_unauthenticated_requests_total reason=invalid_token)
[[ "$missing" == 3 && "$invalid" == 2 ]] &&
  pass "refusals counted by reason over both ports (missing_token 3, invalid_token 2)" ||
  fail "refusals counted: missing_token=$missing invalid_token=$invalid, want 3 and 2"
echo '{"saveAs": "fitted_by_test"}' >"$workdir/save.json"
expect_refused "tokens: save_as without the permission -> PERMISSION_DENIED" \
  "PERMISSION_DENIED: save_as" "${tls[@]}" --token="$token_plain" \
  fit-bandwidth --input="$workdir/save.json" --shape=x_train=50,y_train=50
expect_ok "tokens: save_as with the permission" "${tls[@]}" --token="$token_saver" \
  fit-bandwidth --input="$workdir/save.json" --shape=x_train=50,y_train=50
[[ -f "$workdir/models/fitted_by_test/config.pbtxt" ]] &&
  pass "the permitted save_as wrote the model" ||
  fail "the permitted save_as wrote nothing under $workdir/models"
# append: AppendMemory needs the permission append (or model_control).
expect_refused "tokens: an append by a plain token -> PERMISSION_DENIED" \
  "PERMISSION_DENIED" "${tls[@]}" --token="$token_plain" append \
  --memory_name=appended_by_test --create
[[ ! -e "$workdir/models/appended_by_test" ]] &&
  pass "the refused append wrote nothing" ||
  fail "the refused append wrote $workdir/models/appended_by_test"
expect_ok "tokens: an append by an append token" "${tls[@]}" \
  --token="$token_appender" append --memory_name=appended_by_test --create
expect_ok "tokens: an append by a model_control token" "${tls[@]}" \
  --token="$token_controller" append --memory_name=appended_by_test
expect_refused "tokens: an eviction by a plain token -> PERMISSION_DENIED" \
  "PERMISSION_DENIED" "${tls[@]}" --token="$token_plain" evict \
  --memory_name=appended_by_test --oldest=1
expect_ok "tokens: an eviction by an append token" "${tls[@]}" \
  --token="$token_appender" evict --memory_name=appended_by_test --oldest=1
# model_control: KServe RepositoryModelUnload / Load need the permission.
# control TOKEN load|unload MODEL: prints the gRPC status code's name.
control() {
  "$venv/bin/python" - "$GRPC_PORT" "$pki/ca.crt" "$@" <<'PYTHON'
import sys
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
port, ca, token, action, model = sys.argv[1:]
with open(ca, "rb") as f:
    credentials = grpc.ssl_channel_credentials(f.read())
with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    call, request = ((stub.RepositoryModelLoad,
                      service_pb2.RepositoryModelLoadRequest(model_name=model))
                     if action == "load" else
                     (stub.RepositoryModelUnload,
                      service_pb2.RepositoryModelUnloadRequest(model_name=model)))
    try:
        call(request, metadata=[("authorization", f"Bearer {token}")],
             timeout=10)
        print("OK")
    except grpc.RpcError as e:
        print(e.code().name)
PYTHON
}
ensure_venv "$venv" "$repo/tests/kserve/requirements.txt"
for check in "$token_plain unload PERMISSION_DENIED" \
             "$token_saver load PERMISSION_DENIED" \
             "$token_controller unload OK" \
             "$token_controller load OK"; do
  read -r token action want <<<"$check"
  got=$(control "$token" "$action" additive_attention 2>&1 | tail -n 1)
  who=plain
  [[ $token == "$token_saver" ]] && who=save_as
  [[ $token == "$token_controller" ]] && who=model_control
  [[ "$got" == "$want" ]] &&
    pass "tokens: $action by a $who token -> $want" ||
    fail "tokens: $action by a $who token -> $got, want $want"
done

# An edit takes effect without a restart (the file is polled every second).
printf '%s\n%s save_as\n%s\n' "$token_plain" "$token_saver" "$token_new" \
  >"$workdir/tokens.next"
mv "$workdir/tokens.next" "$workdir/tokens"
for ((i = 0; i < 50; i++)); do
  ctl "${tls[@]}" --token="$token_new" "${call[@]}" >/dev/null 2>&1 && break
  sleep 0.1
done
expect_ok "tokens: a token added to the file works within seconds" \
  "${tls[@]}" --token="$token_new" "${call[@]}"
# SIGHUP reloads at once; a token removed is refused.
printf '%s save_as\n' "$token_saver" >"$workdir/tokens"
kill -HUP "$SERVER_PID"
for ((i = 0; i < 50; i++)); do
  grep -q "SIGHUP: reloaded 1 tokens" "$workdir/tokens.log" && break
  sleep 0.1
done
expect_refused "tokens: a token removed and SIGHUP -> UNAUTHENTICATED" \
  "UNAUTHENTICATED" "${tls[@]}" --token="$token_plain" "${call[@]}"
# A broken file keeps the tokens in force.
printf 'short\n' >"$workdir/tokens"
kill -HUP "$SERVER_PID"
sleep 0.5
expect_ok "tokens: a broken file on SIGHUP keeps the previous tokens" \
  "${tls[@]}" --token="$token_saver" "${call[@]}"
kill -0 "$SERVER_PID" 2>/dev/null && pass "the server survived the broken file" ||
  fail "the server died on a broken token file"
stop_server
if grep -q -e "$token_plain" -e "$token_saver" -e "$token_new" \
    -e "$token_controller" "$workdir"/*.log; then
  fail "a token appears in the server's log"
else
  pass "no token in the server's log"
fi

# --- 5. client-side checks -----------------------------------------------------------
if "$attnctl" --target=127.0.0.1:1 --token="$token_plain" health >"$workdir/out" 2>"$workdir/err"; then
  fail "attnctl --token without TLS ran"
elif grep -q "\-\-token needs --tls" "$workdir/err"; then
  pass "attnctl refuses --token without TLS"
else
  fail "attnctl --token without TLS: $(head -c 200 "$workdir/err")"
fi

echo "security: $failures failed"
((failures == 0))

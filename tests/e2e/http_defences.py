"""The HTTP port's defences and drain, as a hostile or hurried client sees them.

    http_defences.py limits PORT METRICS_PORT
    http_defences.py drain PORT PID
    http_defences.py readme PORT README

`limits` expects a server started with --http_max_connections=8
--http_request_timeout_ms=1500 --http_max_header_bytes=4096
--max_message_bytes=1048576; `drain` one with --drain_notice_ms=1500,
--worker_threads=1 --kernel_threads=1, whose pid is PID (it sends SIGTERM).
Prints "ok ..." or "FAIL ..." per check and exits 1 on any failure. Only the
standard library: runs under Debian's /usr/bin/python3. `readme` runs the
README's `$ curl` lines (its HTTP/REST section) against PORT and compares
their output with the README's: text exactly, JSON field by field with
numbers within 1e-6 (another CPU may round the last bit differently).
"""

import array
import http.client
import json
import os
import math
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

failures = 0


def check(name, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        failures += 1


def closed_within(sock, seconds):
    """Seconds until the server closed `sock` (reads EOF or a reset), or None."""
    sock.settimeout(0.05)
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - start
    return None


TOY = json.dumps({"inputs": [{"name": "X", "shape": [1, 1, 2],
                              "datatype": "FP32", "data": [1, 2]}]})


def infer(port, body=TOY, model="masked_softmax", timeout=30, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    connection.request("POST", f"/v2/models/{model}/infer", body=body,
                       headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def metric(metrics_port, name):
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def limits(port, metrics_port):
    refused_before = metric(metrics_port, "attnserve_connections_refused_total")
    # 1. The connection cap: 8 held open, the next ones closed at once.
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    time.sleep(0.3)
    extra = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    times = [closed_within(s, 1.0) for s in extra]
    check("connection cap: connections over --http_max_connections are closed "
          "at once", all(t is not None and t < 1.0 for t in times), str(times))
    refused = metric(metrics_port, "attnserve_connections_refused_total")
    check("connection cap: refusals counted in "
          "attnserve_connections_refused_total",
          refused - refused_before >= 2, f"{refused_before} -> {refused}")
    for s in held + extra:
        s.close()
    time.sleep(0.5)  # the loop's sweep lets them go
    status, _ = infer(port)
    check("connection cap: served again once connections closed", status == 200,
          str(status))

    # 2. Slow headers (slowloris): one byte every 0.3 s is cut off at the
    # request deadline, not kept alive by each byte.
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"POST /v2/models/masked_softmax/infer HTTP/1.1\r\n")
    start = time.monotonic()
    closed = None
    slow.settimeout(0.3)
    while time.monotonic() - start < 6:
        try:
            slow.sendall(b"X")
            if slow.recv(65536) == b"":
                closed = time.monotonic() - start
                break
        except socket.timeout:
            continue
        except OSError:
            closed = time.monotonic() - start
            break
    check("slow client: a request dribbled byte by byte is cut off near "
          "--http_request_timeout_ms (1.5 s)",
          closed is not None and closed < 3.5, f"closed after {closed}")
    slow.close()

    # 3. An idle keep-alive connection is closed after the same time.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/v2/health/live")
    connection.getresponse().read()
    idle = closed_within(connection.sock, 4.0)
    check("keep-alive: an idle connection is closed after the request timeout",
          idle is not None and 1.0 < idle < 3.5, f"closed after {idle}")
    connection.close()

    # 4. Headers over --http_max_header_bytes: refused, nothing served.
    big = socket.create_connection(("127.0.0.1", port))
    big.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " +
                b"a" * 8192 + b"\r\n\r\n")
    big.settimeout(5)
    reply = b""
    try:
        while True:
            chunk = big.recv(65536)
            if not chunk:
                break
            reply += chunk
    except OSError:
        pass
    check("headers over --http_max_header_bytes are refused",
          not reply.startswith(b"HTTP/1.1 200"), reply[:80].decode("latin-1"))
    big.close()

    # 5. A body over --max_message_bytes: 413 before it is sent.
    body_socket = socket.create_connection(("127.0.0.1", port))
    body_socket.sendall(b"POST /v2/models/masked_softmax/infer HTTP/1.1\r\n"
                        b"Host: x\r\nContent-Length: 2097152\r\n\r\n")
    body_socket.settimeout(5)
    try:
        head = body_socket.recv(65536)
    except OSError:
        head = b""
    check("a body over --max_message_bytes is refused with 413 before it "
          "arrives", head.startswith(b"HTTP/1.1 413"), head[:80].decode("latin-1"))
    # A client that sends its body anyway (most do: they read the answer
    # once the body is out) must not be reset: the server drains what comes
    # until the client closes. Later than the server's 200 ms sweep, which
    # let the socket go and reset it before.
    time.sleep(0.5)
    try:
        body_socket.sendall(b" " * 2097152)
        body_socket.shutdown(socket.SHUT_WR)
        tail = body_socket.recv(65536)
        outcome = "the body was taken, then end of stream" if tail == b"" \
            else f"more bytes after the 413: {tail[:80]!r}"
        drained = tail == b""
    except OSError as e:
        outcome, drained = f"{e!r}", False
    check("a body sent after its 413 is drained, not reset", drained, outcome)
    body_socket.close()
    status, _ = infer(port)
    check("the port still serves after all of it", status == 200, str(status))


def drain(port, pid):
    # Heavy calls queued on one worker: accepted before the drain, they
    # must all finish with 200.
    n = 2048
    zeros = array.array("f", bytes(8 * n * 64 * 4)).tobytes()
    header = json.dumps({"inputs": [
        {"name": name, "shape": [8, n, 64], "datatype": "FP32",
         "parameters": {"binary_data_size": len(zeros)}}
        for name in ("queries", "keys", "values")]}).encode()
    body = header + zeros * 3
    results = []

    def heavy():
        results.append(infer(port, body, "dot_product_attention", 120, {
            "Inference-Header-Content-Length": str(len(header))})[0])

    status, _ = infer(port)
    check("drain: served before SIGTERM", status == 200, str(status))
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.3)
    ready = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    ready.request("GET", "/v2/health/ready")
    ready_status = ready.getresponse().status
    check("drain: health/ready answers 503 during the notice",
          ready_status == 503, str(ready_status))
    status, _ = infer(port)
    check("drain: calls are still served during the notice", status == 200,
          str(status))
    threads = [threading.Thread(target=heavy) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # the notice is over; the heavy calls are queued
    try:
        late, data = infer(port)
        late_ok = late == 503
        detail = f"{late} {data[:120]!r}"
    except OSError as error:  # the listener may already be gone
        late_ok, detail = True, str(error)
    check("drain: a call after the notice is refused (503 or no connection)",
          late_ok, detail)
    for thread in threads:
        thread.join()
    check("drain: calls accepted before the drain all finish with 200",
          results == [200, 200, 200], str(results))


def same_json(want, got):
    if isinstance(want, float) or isinstance(got, float):
        return (isinstance(want, (int, float)) and isinstance(got, (int, float))
                and math.isclose(want, got, rel_tol=1e-6, abs_tol=1e-7))
    if isinstance(want, list):
        return (isinstance(got, list) and len(want) == len(got)
                and all(same_json(w, g) for w, g in zip(want, got)))
    if isinstance(want, dict):
        return (isinstance(got, dict) and want.keys() == got.keys()
                and all(same_json(want[k], got[k]) for k in want))
    return want == got


def readme(port, path):
    lines = open(path).read().split("\n")
    start = lines.index("### KServe v2 over HTTP/REST")
    commands = []  # (command, expected output lines)
    i = start + 1
    while i < len(lines) and not lines[i].startswith("### "):
        if lines[i].startswith("    $ curl"):
            command = lines[i][6:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + lines[i].strip()
            expected = []
            while i + 1 < len(lines) and lines[i + 1].startswith("    ") and \
                    not lines[i + 1].startswith("    $ "):
                i += 1
                expected.append(lines[i][4:])
            commands.append((command, expected))
        i += 1
    check("README: its HTTP section shows curl lines", len(commands) >= 2,
          str(len(commands)))
    for command, expected in commands:
        run = command.replace("localhost:8000", f"127.0.0.1:{port}")
        out = subprocess.run(["bash", "-c", run], capture_output=True,
                             text=True, timeout=30).stdout.rstrip("\n")
        want = "\n".join(expected)
        try:
            ok = same_json(json.loads(want), json.loads(out))
        except ValueError:
            ok = out == want
        check(f"README: `{command[:60]}...` prints what the README shows", ok,
              f"got {out[:200]!r}, README {want[:200]!r}")


if __name__ == "__main__":
    if sys.argv[1] == "readme":
        readme(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "limits":
        limits(int(sys.argv[2]), int(sys.argv[3]))
    else:
        drain(int(sys.argv[2]), int(sys.argv[3]))
    sys.exit(1 if failures else 0)

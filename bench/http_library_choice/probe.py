#!/usr/bin/env python3
"""Checks each echo server's defences by behaviour (run.sh starts them with a
2 s timeout: TIMEOUT_S=2).

  probe.py NAME=PORT [NAME=PORT ...]

Phase 1, all probes on all servers at once, each on its own connection:
  slow headers  request line, then one header byte every 0.5 s
  slow body     full headers (Content-Length: 1000), then one body byte
                every 0.5 s
  idle k-a      one complete request, then nothing: when is it closed?
  64K header    one 64 KiB header: the answer
  CL 1e11       "Content-Length: 100000000000" and no body: the answer
Phase 2, per server: 300 idle connections (connected, nothing sent), then
  one ordinary request on a new connection: how long until it is answered.
Prints a markdown table.
"""
import socket
import sys
import threading
import time

PATH = "/v2/models/m/infer"
LIMIT = 12.0  # seconds a slow client keeps trying


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def closed_or_answered(s, wait):
    """Waits up to `wait` s for the server to answer or close. Returns None
    (nothing yet), 'closed', or the status line."""
    s.settimeout(wait)
    try:
        data = s.recv(65536)
    except socket.timeout:
        return None
    except OSError:
        return "closed"
    if not data:
        return "closed"
    return data.split(b"\r\n", 1)[0].decode("latin-1")


def read_response(s):
    """Reads one whole response (headers, then Content-Length bytes): the
    server may send headers and body in separate segments."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            return buf
        buf += d
    head, body = buf.split(b"\r\n\r\n", 1)
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(body) < n:
        d = s.recv(65536)
        if not d:
            break
        body += d
    return head


def trickle(port, prefix, what):
    s = connect(port)
    t0 = time.monotonic()
    try:
        s.sendall(prefix)
        while time.monotonic() - t0 < LIMIT:
            r = closed_or_answered(s, 0.5)
            if r is not None:
                return "%s after %.1f s" % (
                    "closed" if r == "closed" else "'%s'" % r,
                    time.monotonic() - t0)
            s.sendall(what)
    except OSError:
        return "closed after %.1f s" % (time.monotonic() - t0)
    finally:
        s.close()
    return "still open at %.0f s" % LIMIT


def slow_headers(port):
    return trickle(port, ("POST %s HTTP/1.1\r\nHost: a\r\nX-Slow: " % PATH)
                   .encode(), b"a")


def slow_body(port):
    return trickle(port, ("POST %s HTTP/1.1\r\nHost: a\r\nContent-Length: 1000"
                          "\r\n\r\n" % PATH).encode(), b"1")


def idle_keepalive(port):
    s = connect(port)
    try:
        s.sendall(("POST %s HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"
                   % PATH).encode())
        s.settimeout(5)
        read_response(s)
        t0 = time.monotonic()
        r = closed_or_answered(s, LIMIT)
        if r is None:
            return "still open at %.0f s" % LIMIT
        return "%s after %.1f s" % (r, time.monotonic() - t0)
    except OSError as e:
        return "error %s" % e
    finally:
        s.close()


def one_shot(port, req):
    s = connect(port)
    try:
        try:
            s.sendall(req)
        except OSError:
            pass  # the server may close while we are still sending
        t0 = time.monotonic()
        r = closed_or_answered(s, 3.0)
        if r is None:
            return "no answer in 3 s"
        return "%s (%.1f s)" % ("closed" if r == "closed" else "'%s'" % r,
                                time.monotonic() - t0)
    finally:
        s.close()


def big_header(port):
    return one_shot(port, ("POST %s HTTP/1.1\r\nHost: a\r\nX-Big: %s\r\n"
                           "Content-Length: 2\r\n\r\n{}"
                           % (PATH, "a" * 65536)).encode())


def huge_content_length(port):
    return one_shot(port, ("POST %s HTTP/1.1\r\nHost: a\r\n"
                           "Content-Length: 100000000000\r\n\r\n" % PATH)
                    .encode())


def crowd(port, n=300):
    idle = []
    try:
        for _ in range(n):
            idle.append(connect(port))
        time.sleep(0.2)
        t0 = time.monotonic()
        s = connect(port)
        s.sendall(("POST %s HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"
                   % PATH).encode())
        r = closed_or_answered(s, 15.0)
        s.close()
        if r is None:
            return "no answer in 15 s"
        return "%s in %.2f s" % ("closed" if r == "closed" else "'%s'" % r,
                                 time.monotonic() - t0)
    except OSError as e:
        return "error %s" % e
    finally:
        for c in idle:
            c.close()


PROBES = [("slow headers (1 B/0.5 s)", slow_headers),
          ("slow body (1 B/0.5 s)", slow_body),
          ("idle keep-alive", idle_keepalive),
          ("64 KiB header", big_header),
          ("Content-Length 1e11", huge_content_length)]


def main():
    servers = [a.split("=") for a in sys.argv[1:]]
    results = {}
    threads = []
    for name, port in servers:
        for pname, fn in PROBES:
            def run(name=name, port=int(port), pname=pname, fn=fn):
                try:
                    results[(name, pname)] = fn(port)
                except Exception as e:  # report, do not die
                    results[(name, pname)] = "error %s" % e
            t = threading.Thread(target=run)
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    for name, port in servers:
        results[(name, "crowd")] = crowd(int(port))
    cols = [p for p, _ in PROBES] + ["request after 300 idle conns"]
    print("| server | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, _ in servers:
        row = [results[(name, p)] for p, _ in PROBES] + [results[(name, "crowd")]]
        print("| %s | %s |" % (name, " | ".join(row)))


if __name__ == "__main__":
    main()

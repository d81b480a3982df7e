#!/usr/bin/python3
"""test_metrics_http.py COHORT - the HTTP server of `cohort run
--metrics-port` stays small and bounded, on loopback.

One agent (2 ranks that wait for a file, at most 60 s) serves the port.
Checks: GET /metrics is 200 with the exposition and its content type, HEAD
has the headers alone, a request sent in pieces is answered, another path is
404, another method 405, and garbage, a NUL byte or a request larger than
the server's buffer (2 KiB) 400 (each answer closes the connection); twelve
idle connections (the server takes eight at a time) do not starve a
client that comes after them: the idle ones are closed after 5 s and the
client is served; a client that never reads its answer does not stop the
loop; the workers never inherit the listening socket; a taken port is a
one-line error and exit 2.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

from checks import check, report

COHORT = os.path.abspath(sys.argv[1])


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ask(port, data, pieces=1, timeout=15):
    """Sends data (in pieces, 0.2 s apart), returns all the server sends
    until it closes; None when it did not answer in time."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        step = max(1, len(data) // pieces)
        for i in range(0, len(data), step):
            s.sendall(data[i:i + step])
            if pieces > 1:
                time.sleep(0.2)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
    except socket.timeout:
        return None
    finally:
        s.close()


def status(resp):
    return resp.split(b"\r\n", 1)[0].decode() if resp else None


def main():
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        go = os.path.join(d, "go")
        fds = os.path.join(d, "fds")
        # Each worker notes its open sockets (none may be the server's), then waits.
        work = ("ls -l /proc/$$/fd > %s.$RANK; i=0; while [ $i -lt 600 ] && [ ! -e %s ]; do "
                "i=$((i + 1)); echo $i > \"$COHORT_PROGRESS\"; sleep 0.1; done" % (fds, go))
        agent = subprocess.Popen([COHORT, "run", "--nproc-per-node", "2", "--metrics-port",
                                  str(port), "--", "sh", "-c", work],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            run_checks(port, agent, fds)
        finally:
            open(go, "w").close()
            try:
                out, _ = agent.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                agent.kill()
                out, _ = agent.communicate()
        check(agent.returncode == 0, "the job ends well: %s %s" % (agent.returncode, out))
    return report()


def run_checks(port, agent, fds):
    deadline = time.time() + 30
    resp = None
    while time.time() < deadline:
        try:
            resp = ask(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            if resp and b"cohort_rank_step{" in resp:
                break
        except OSError:
            pass
        time.sleep(0.2)
    check(status(resp) == "HTTP/1.1 200 OK", "GET /metrics: %r" % (resp or b"")[:80])
    head, _, body = (resp or b"").partition(b"\r\n\r\n")
    check(b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in head, "content type")
    check(b"Content-Length: %d" % len(body) in head, "content length matches the body")
    check(b"Connection: close" in head, "connection close")
    check(b'cohort_world_size{' in body and b"} 2\n" in body, "the exposition")

    resp = ask(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    check(status(resp) == "HTTP/1.1 200 OK" and resp.endswith(b"\r\n\r\n"), "HEAD: headers only")
    resp = ask(port, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n", pieces=5)
    check(status(resp) == "HTTP/1.1 200 OK", "a request in five pieces")
    cases = [
        (b"GET / HTTP/1.1\r\n\r\n", "404"),
        (b"GET /metricsx HTTP/1.1\r\n\r\n", "404"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", "405"),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\n\n", "400"),
        (b"GET /metrics HTTP/1.1\r\nHost: \x00\r\n\r\n", "400"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 3000 + b"\r\n\r\n", "400"),
        (b"GET " + b"/" * 3000, "400"),
        (b"GET metrics HTTP/1.1\r\n\r\n", "400"),
        (b"GET /metrics HTTP/2\r\n\r\n", "400"),
    ]
    for data, want in cases:
        resp = ask(port, data)
        check(resp is not None and status(resp).split(" ")[1] == want,
              "%r...: %s, got %r" % (data[:30], want, status(resp)))

    # Twelve idle connections, then a client: served once the idle ones time out.
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(12)]
    t0 = time.time()
    resp = ask(port, b"GET /metrics HTTP/1.1\r\n\r\n", timeout=30)
    waited = time.time() - t0
    check(status(resp) == "HTTP/1.1 200 OK", "a client after 12 idle ones is served")
    check(waited < 25, "... within two of the idle ones' deadlines (%.1f s)" % waited)
    closed = 0
    for s in idle:
        try:
            s.settimeout(10)
            closed += s.recv(1) == b""
        except (socket.timeout, ConnectionError):
            pass
        s.close()
    check(closed == 12, "the idle connections were closed by the server (%d of 12)" % closed)

    # A client that sends a request and never reads: the loop goes on.
    lazy = socket.create_connection(("127.0.0.1", port), timeout=10)
    lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    lazy.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    resp = ask(port, b"GET /metrics HTTP/1.1\r\n\r\n", timeout=30)
    check(status(resp) == "HTTP/1.1 200 OK", "a client that does not read stops no one")
    lazy.close()
    check(agent.poll() is None, "the agent still runs")

    # The workers do not hold the listening socket.
    listening = set()
    with open("/proc/net/tcp6") as f6, open("/proc/net/tcp") as f4:
        for line in f6.readlines()[1:] + f4.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].split(":")[1], 16) == port:
                listening.add(cols[9])
    check(len(listening) == 1, "one listening socket on the port")
    for rank in (0, 1):
        with open("%s.%d" % (fds, rank)) as f:
            text = f.read()
        check(not any("socket:[%s]" % inode in text for inode in listening),
              "rank %d has no descriptor of the server" % rank)

    # The port taken: a one-line error, exit 2.
    p = subprocess.run([COHORT, "run", "--metrics-port", str(port), "--", "true"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and p.stderr.count("\n") == 1 and "metrics" in p.stderr,
          "a taken port: %d %r" % (p.returncode, p.stderr))


sys.exit(main())

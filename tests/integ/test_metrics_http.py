#!/usr/bin/env python3
"""patd's metrics endpoint (http://127.0.0.1:<metrics_port>/metrics) against hostile local
clients, on a real patd (cpu backend). Any local user can reach the port, and any member of the
socket group can make the daemon hold descriptors; neither may lock a scraper out:

  - fds: patd holding more than 2,000 descriptors (sessions opened by raw HELLOs on its admin
    socket, each with its control connection bound and its pid watched: two descriptors) still
    answers a scrape with the page. select() cannot watch a
    descriptor numbered 1,024 or more: libmicrohttpd on select() closed such connections unanswered.
  - tricklers: 256 clients (the endpoint's connection cap, PATD_METRICS_MAX_CONNS) that send a
    request one byte every 0.5 s and never finish it, reconnecting whenever they are cut: a scrape
    from another client answers within SCRAPE_S, five times in a row, and each trickler's connection
    is cut within CUT_S of its connect. An idle timeout never closes a trickler (it is never idle).
  - header: a request whose headers pass the endpoint's budget (8 KiB of libmicrohttpd's
    per-connection memory) is refused with 431; one within it is served.

Standard library only. PATD_BIN points at the build (make test sets it).
"""

import os
import resource
import selectors
import signal
import re
import socket
import struct
import sys
import subprocess
import tempfile
import threading
import time
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BUILD = os.environ.get("PATD_DEMO_BUILD", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from tl_port import free_port  # noqa: E402
PATD = os.environ.get("PATD_BIN", os.path.join(BUILD, "bin", "patd"))

FDS = 2100           # descriptors the daemon is made to hold, past select()'s 1,024
TRICKLERS = 256      # = PATD_METRICS_MAX_CONNS (daemon/patd_int.h): every slot taken
SCRAPE_S = 3.0       # a scrape's answer, from connect to the last byte
CUT_S = 3.0          # a trickler's connection, from connect to seeing the cut (deadline: 1 s)
# a HELLO frame (ipc/ipc_proto.h): a 40-byte header, then ipc_hello_req_t (model signature of the
# daemon's defaults, pid, 1 batch token, host buffers, label)
# a connection after 1 s; with it the connection stays, one descriptor in the daemon
HDR = struct.Struct("<IHHIIQQQ")  # magic, version, opcode, flags, body_len, corr, session, key
IPC_MAGIC, IPC_OP_HELLO = 0x44544150, 1


def ipc_version():
    with open(os.path.join(ROOT, "ipc", "ipc_proto.h")) as f:
        return int(re.search(r"#define IPC_VERSION\s+(\d+)u", f.read()).group(1))


def hello_frame(corr):
    body = struct.pack("<6IQ", 4, 8, 2, 64, 1, 16, 0)  # the built-in model, f16, id 0
    body += struct.pack("<6I", os.getpid(), 1, 0, 1, 0, 0) + b"fds".ljust(64, b"\0")
    return HDR.pack(IPC_MAGIC, ipc_version(), IPC_OP_HELLO, 0, len(body), corr, 0, 0) + body


def raise_nofile(want):
    """This process's descriptor limit to at least want (root raises the hard limit too); the
    daemon inherits it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))  # fails unless root: says why
    elif soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def scrape(port, timeout, headers=""):
    """GET /metrics on a connection of its own: (status, body, seconds), status 0 when no
    answer came within timeout (or the server closed without one)."""
    t0 = time.monotonic()
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n%sConnection: close\r\n\r\n"
                       % headers).encode())
            while time.monotonic() - t0 < timeout:
                s.settimeout(max(0.01, timeout - (time.monotonic() - t0)))
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    words = head.split(b" ", 2)
    status = int(words[1]) if len(words) > 1 and words[0].startswith(b"HTTP/") else 0
    return status, body.decode(errors="replace"), time.monotonic() - t0


class Tricklers:
    """n connections to the port, each sending a request one byte every interval and never
    finishing it; a connection the server cuts is opened again at once (a hostile client keeps
    the slots full). Counts the cuts and each connection's life."""

    REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100000

    def __init__(self, port, n, interval):
        self.port, self.n, self.interval = port, n, interval
        self.cuts, self.lives, self.errors = 0, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.sel = selectors.DefaultSelector()

    def open_one(self):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.sel.register(s, selectors.EVENT_READ, {"t0": time.monotonic(), "sent": 0})

    def close_one(self, key, cut):
        self.sel.unregister(key.fileobj)
        key.fileobj.close()
        if cut:
            self.cuts += 1
            self.lives.append(time.monotonic() - key.data["t0"])

    def run(self):
        try:
            for _ in range(self.n):
                self.open_one()
            next_send = time.monotonic()
            while not self.stop.is_set():
                for key, _ in self.sel.select(timeout=max(0, next_send - time.monotonic())):
                    try:  # readable: the server closed it (or answered: it never should)
                        gone = not key.fileobj.recv(4096)
                    except OSError:
                        gone = True
                    if gone:
                        self.close_one(key, cut=True)
                        self.open_one()
                if time.monotonic() >= next_send:
                    next_send += self.interval
                    for key in list(self.sel.get_map().values()):
                        d = key.data
                        try:
                            key.fileobj.send(self.REQUEST[d["sent"]:d["sent"] + 1])
                            d["sent"] += 1
                        except BlockingIOError:
                            pass  # still connecting (waits in the listen backlog)
                        except OSError:
                            self.close_one(key, cut=True)
                            self.open_one()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))
        finally:
            for key in list(self.sel.get_map().values()):
                key.fileobj.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


class MetricsHttpCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise_nofile(FDS + TRICKLERS + 512)
        cls.port = free_port()
        cls.dir = tempfile.mkdtemp(prefix="patd-metrics-http.")
        cls.sock = os.path.join(cls.dir, "patd.sock")
        cls.log = open(os.path.join(cls.dir, "patd.log"), "w")
        cls.proc = subprocess.Popen([PATD, "--runtime-dir=" + cls.dir,
                                     "--metrics-port=%d" % cls.port, "--blocks=256",
                                     "--max-conns=2048", "--max-seqs=4096",
                                     "--conn-max-seqs=1"],
                                    stderr=cls.log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if scrape(cls.port, 1.0)[0] == 200:
                return
            if cls.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("patd did not serve metrics (log: %s)" % cls.log.name)

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        try:
            rc = cls.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            cls.proc.kill()
            rc = cls.proc.wait()
        cls.log.close()
        if rc == 0 and not os.environ.get("PATD_TEST_KEEP_LOGS"):
            subprocess.run(["rm", "-rf", cls.dir], check=False)
        assert rc == 0, "patd exited %d (log in %s)" % (rc, cls.dir)

    def fd_count(self):
        return len(os.listdir("/proc/%d/fd" % self.proc.pid))

    def assert_page(self, status, body, took, what):
        self.assertEqual(status, 200, "%s: no 200 within %.1f s (took %.2f s; log %s)"
                         % (what, SCRAPE_S, took, self.log.name))
        self.assertIn("patd_build_info{", body, what)
        self.assertIn("patd_steps_total", body, what)

    def test_fds(self):
        conns = []
        try:
            admin = self.sock[:-5] + ".admin"
            for i in range(FDS // 2 + 50):  # two descriptors a session
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(admin)
                    s.sendall(hello_frame(i + 1))
                    msg, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(8))
                    for level, kind, data in anc:  # the staging memfd: not ours to keep
                        if kind == socket.SCM_RIGHTS:
                            os.close(int.from_bytes(data[:4], "little"))
                    self.assertEqual(HDR.unpack(msg[:40])[3] & 2, 0, "HELLO %d refused" % i)
                session, key = struct.unpack_from("<Q", msg, 40)[0], struct.unpack_from(
                    "<Q", msg, 40 + 264)[0]  # ipc_hello_rep_t's session and key
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.connect(self.sock)  # its control connection, bound by a PING
                c.sendall(HDR.pack(IPC_MAGIC, ipc_version(), 3, 0, 0, i + 1, session, key))
                self.assertEqual(len(c.recv(40)), 40)
                conns.append(c)
            deadline = time.monotonic() + 20
            while self.fd_count() < FDS and time.monotonic() < deadline:
                time.sleep(0.05)
            held = self.fd_count()
            self.assertGreater(held, FDS, "patd holds %d descriptors" % held)
            for i in range(3):
                self.assert_page(*scrape(self.port, SCRAPE_S),
                                 "scrape %d with %d descriptors held" % (i, held))
        finally:
            for s in conns:
                s.close()

    def test_tricklers(self):
        with Tricklers(self.port, TRICKLERS, 0.5) as t:
            time.sleep(1.5)  # every slot taken, some cut and taken again
            for i in range(5):
                self.assert_page(*scrape(self.port, SCRAPE_S),
                                 "scrape %d beside %d tricklers" % (i, TRICKLERS))
        self.assertEqual(t.errors, [])
        # the deadline, not a cap above the tricklers, let the scrapes in: every slot was cut
        self.assertGreaterEqual(t.cuts, TRICKLERS)
        self.assertLess(max(t.lives), CUT_S, "a trickler lived %.1f s" % max(t.lives))

    def test_header_budget(self):
        status, _, _ = scrape(self.port, SCRAPE_S, "X-Big: %s\r\n" % ("a" * 12000))
        self.assertEqual(status, 431)
        self.assert_page(*scrape(self.port, SCRAPE_S, "X-Ok: %s\r\n" % ("a" * 1000)),
                         "a scrape with 1 KB of headers")


if __name__ == "__main__":
    unittest.main(verbosity=2)

#!/usr/bin/env python3
"""patd started exactly as systemd starts the shipped units, with the shipped config.

For systemd/patd.service and systemd/patd@.service (instances 0 and 1, %i expanded) this reads
ExecStart=, Environment=, User=, Group=, RuntimeDirectory=, RuntimeDirectoryMode=, UMask=,
LimitNOFILE=, LimitMEMLOCK=, Type=notify and WatchdogSec= from the unit file, stages an install
the way `make install` lays it out (the binary at <root>/usr/local/bin/patd, systemd/patd.conf as
<root>/etc/patd/patd.conf; the unit's absolute paths point into <root>), creates the account
from systemd/patd.sysusers with systemd-sysusers, makes the runtime directory, and starts the
command line as that user with that environment, a NOTIFY_SOCKET it listens on (READY=1 and
STATUS= must come from the main pid: NotifyAccess=main) and WATCHDOG_USEC. It then checks the
backend and device in READY's STATUS=, in `patctl status` and in the metrics page; stops it with
SIGTERM as systemctl stop does, and wants exit status 0 within TimeoutStopSec=.

Not emulated: the sandboxing directives (ProtectSystem=, DevicePolicy=, ...; systemd-analyze
verify checks them in systemd_verify.sh).

  --expect cpu   (default; CI, no GPU): the cpu backend, with the notice that says why not cuda
  --expect cuda  (tests/gpu/run.sh): the cuda backend on the GPU. The two patd@ instances then
                 share the one GPU: instance 1 is started with CUDA_VISIBLE_DEVICES=0 instead of
                 its unit's 1, each with a drop-in /etc/patd/patd@N.conf giving it
                 gpu.memory_fraction 0.3 (what an operator running two on one GPU writes); and
                 patd@1 with its unit's own CUDA_VISIBLE_DEVICES=1 on a one-GPU host must stop
                 at start, naming the cause, instead of serving from the CPU.

Needs root (it creates the account and /run/patd); as another user it says so and fails.
PATD_BIN and PATCTL_BIN point at the build (make test sets them).
"""

import argparse
import os
import pwd
import grp
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BUILD = os.environ.get("PATD_DEMO_BUILD", os.path.join(ROOT, "build"))
PATD = os.environ.get("PATD_BIN", os.path.join(BUILD, "bin", "patd"))
PATCTL = os.environ.get("PATCTL_BIN", os.path.join(BUILD, "bin", "patctl"))
UNITS = os.path.join(ROOT, "systemd")
EXPECT = "cpu"
READY_S = 120  # the sanitizer build commits a 2 GiB cpu pool page by page under ASan


def parse_unit(path, instance=None):
    """The [Service] section as {key: [values]}, %i expanded, comments and blank lines dropped."""
    out, section = {}, None
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
                continue
            if section != "[Service]":
                continue
            key, _, val = line.partition("=")
            if instance is not None:
                val = val.replace("%i", instance).replace("%I", instance)
            out.setdefault(key.strip(), []).append(val.strip())
    return out


def seconds(val):
    """A systemd time span such as 30s, 2min, 500ms, as seconds."""
    m = re.fullmatch(r"(\d+)\s*(ms|s|min)?", val)
    assert m, "unknown time span %r" % val
    n = int(m.group(1))
    return {"ms": n / 1000.0, "s": n, None: n, "min": 60 * n}[m.group(2)]


class Staged:
    """An install laid out as `make install` does, under a root the patd user can read."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="patd-units-")
        os.chmod(self.root, 0o755)
        for d in ("usr/local/bin", "etc/patd"):
            os.makedirs(os.path.join(self.root, d), mode=0o755)
        shutil.copy2(PATD, os.path.join(self.root, "usr/local/bin/patd"))
        shutil.copy2(os.path.join(UNITS, "patd.conf"), os.path.join(self.root, "etc/patd"))
        self.etc = os.path.join(self.root, "etc/patd")

    def path(self, p):
        """A unit's absolute path of the install, inside the staged root."""
        for prefix in ("/usr/local/bin/", "/etc/patd/"):
            if p.startswith(prefix):
                return self.root + p
        return p

    def dropin(self, instance, text):
        with open(os.path.join(self.etc, "patd@%s.conf" % instance), "w") as f:
            f.write(text)

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)


class Notify:
    """The service manager's side of sd_notify: a datagram socket that records each message
    with the sender's pid (SO_PASSCRED), as systemd checks NotifyAccess=main."""

    def __init__(self, where):
        self.path = os.path.join(where, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o777)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.settimeout(0.2)
        self.msgs = []  # (pid, {key: value})

    def poll(self, until, want_key):
        while time.time() < until:
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                continue
            pid = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:12])[0]
            kv = dict(ln.split("=", 1) for ln in data.decode().splitlines() if "=" in ln)
            self.msgs.append((pid, kv))
            if want_key in kv:
                return pid, kv
        return None, None

    def close(self):
        self.sock.close()


class Service:
    """One unit started as systemd would start it."""

    def __init__(self, unit, instance, staged, env_override=None):
        self.unit = parse_unit(os.path.join(UNITS, unit), instance)
        u = self.unit
        assert u["Type"] == ["notify"] and u["NotifyAccess"] == ["main"], u
        self.argv = [staged.path(a) for a in u["ExecStart"][0].split()]
        self.env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "LANG": "C.UTF-8"}
        # the host's loader path (the GPU host's libraries unpacked from .deb files, which an
        # installed host would have in ld.so.conf)
        if os.environ.get("LD_LIBRARY_PATH"):
            self.env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        for e in u.get("Environment", []):
            k, _, v = e.partition("=")
            self.env[k] = v
        self.env.update(env_override or {})
        self.user, self.group = u["User"][0], u["Group"][0]
        self.umask = int(u["UMask"][0], 8)
        self.rundir = os.path.join("/run", u["RuntimeDirectory"][0])
        self.rundir_mode = int(u["RuntimeDirectoryMode"][0], 8)
        self.watchdog = seconds(u["WatchdogSec"][0])
        self.stop_s = seconds(u["TimeoutStopSec"][0])
        self.nofile = int(u["LimitNOFILE"][0])
        self.tmp = tempfile.mkdtemp(prefix="patd-unit-")
        os.chmod(self.tmp, 0o755)
        self.log = os.path.join(self.tmp, "patd.log")
        self.notify = Notify(self.tmp)
        self.pid = None
        self.status = None

    def start(self):
        pw = pwd.getpwnam(self.user)
        gid = grp.getgrnam(self.group).gr_gid
        os.makedirs(self.rundir, exist_ok=True)
        os.chown(self.rundir, pw.pw_uid, gid)
        os.chmod(self.rundir, self.rundir_mode)
        log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pid = os.fork()
        if pid == 0:  # the child becomes the service's main process
            try:
                import resource
                # LimitNOFILE= and LimitMEMLOCK=, as far as this machine lets root raise them
                # (a container without CAP_SYS_RESOURCE keeps its hard limits)
                for res, want in ((resource.RLIMIT_NOFILE, self.nofile),
                                  (resource.RLIMIT_MEMLOCK, resource.RLIM_INFINITY)):
                    try:
                        resource.setrlimit(res, (want, want))
                    except (ValueError, OSError):
                        hard = resource.getrlimit(res)[1]
                        resource.setrlimit(res, (hard, hard))
                os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(pw.pw_uid)
                os.umask(self.umask)
                os.chdir("/")
                env = dict(self.env, NOTIFY_SOCKET=self.notify.path,
                           WATCHDOG_USEC=str(int(self.watchdog * 1e6)),
                           WATCHDOG_PID=str(os.getpid()))
                os.execve(self.argv[0], self.argv, env)
            except BaseException as e:  # what systemd would log as a failed exec
                os.write(2, ("exec %s: %r\n" % (self.argv[0], e)).encode())
            finally:
                os._exit(127)
        os.close(log)
        self.pid = pid
        return self

    def ready(self):
        """STATUS= of READY=1 (sent by the main pid), or None when patd exited first."""
        until = time.time() + READY_S
        while time.time() < until:
            pid, kv = self.notify.poll(min(until, time.time() + 1), "READY")
            if kv:
                assert pid == self.pid, "READY=1 from pid %s, main pid %d" % (pid, self.pid)
                return kv.get("STATUS", "")
            p, st = os.waitpid(self.pid, os.WNOHANG)
            if p:
                self.pid = None
                self.status = os.waitstatus_to_exitcode(st)
                return None
        raise AssertionError("no READY=1 within %d s; log:\n%s" % (READY_S, self.text()))

    def exit_status(self, timeout):
        until = time.time() + timeout
        while time.time() < until:
            if self.pid is None:
                return self.status
            p, st = os.waitpid(self.pid, os.WNOHANG)
            if p:
                self.pid = None
                self.status = os.waitstatus_to_exitcode(st)
                return self.status
            time.sleep(0.05)
        return None

    def stop(self):
        """systemctl stop: SIGTERM, the exit status within TimeoutStopSec= (then SIGKILL)."""
        if self.pid is None:
            return self.status
        os.kill(self.pid, signal.SIGTERM)
        st = self.exit_status(self.stop_s)
        if st is None:
            os.kill(self.pid, signal.SIGKILL)
            self.exit_status(5)
        return st

    def text(self):
        with open(self.log) as f:
            return f.read()

    def close(self):
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            self.exit_status(10)
        self.notify.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def patctl_status(sock):
    r = subprocess.run([PATCTL, "--socket", sock, "status"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, "patctl status: %s %s" % (r.stdout, r.stderr)
    return dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        return r.read().decode()


def config_value(text, section, key):
    sec = None
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("["):
            sec = ln[1:-1]
        elif sec == section and ln.split("=")[0].strip() == key:
            return ln.split("=", 1)[1].strip()
    raise KeyError(key)


def apply_sysusers(path):
    """The snippet's "g NAME -" and "u NAME -:GROUP GECOS HOME SHELL" lines, as system accounts."""
    with open(path) as f:
        for ln in f:
            ln = ln.strip()
            if not ln or ln.startswith("#"):
                continue
            kind, name, rest = ln.split(None, 2) if ln.count(" ") >= 2 else ln.split() + [""]
            if kind == "g":
                try:
                    grp.getgrnam(name)
                except KeyError:
                    subprocess.run(["groupadd", "--system", name], check=True)
            elif kind == "u":
                try:
                    pwd.getpwnam(name)
                    continue
                except KeyError:
                    pass
                m = re.match(r'\S+:(\S+)\s+"([^"]*)"\s+(\S+)\s+(\S+)', rest)
                group, gecos, home, shell = m.groups()
                subprocess.run(["useradd", "--system", "--gid", group, "--comment", gecos,
                                "--home-dir", home, "--no-create-home", "--shell", shell, name],
                               check=True)


def gpus_on_host():
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


class UnitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root")
        # the account, exactly from the shipped snippet (a host without systemd-sysusers, such
        # as the GPU host's container: its u/g lines applied with groupadd/useradd)
        sysusers = os.path.join(UNITS, "patd.sysusers")
        if shutil.which("systemd-sysusers"):
            r = subprocess.run(["systemd-sysusers", sysusers], capture_output=True, text=True)
            assert r.returncode == 0, "systemd-sysusers: %s" % r.stderr
        else:
            apply_sysusers(sysusers)
        pwd.getpwnam("patd")
        grp.getgrnam("patd")
        with open(os.path.join(UNITS, "patd.conf")) as f:
            cls.conf = f.read()
        cls.port = int(config_value(cls.conf, "daemon", "metrics_port"))
        cls.rundir = config_value(cls.conf, "daemon", "runtime_dir")
        for name in ("patd", "patd@0", "patd@1"):
            sock = os.path.join(cls.rundir, name + ".sock")
            if os.path.exists(sock):
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    probe.connect(sock)
                    raise AssertionError("a patd already serves %s: stop it first" % sock)
                except (ConnectionRefusedError, FileNotFoundError):
                    pass
                finally:
                    probe.close()
        cls.rundir_existed = os.path.isdir(cls.rundir)

    @classmethod
    def tearDownClass(cls):
        if not cls.rundir_existed:
            shutil.rmtree(cls.rundir, ignore_errors=True)

    def setUp(self):
        self.staged = Staged()
        self.services = []

    def tearDown(self):
        for s in self.services:
            s.close()
        self.staged.close()

    def service(self, unit, instance=None, env=None):
        s = Service(unit, instance, self.staged, env)
        self.services.append(s)
        return s

    def check_serving(self, s, name, port):
        status = s.ready()
        self.assertIsNotNone(status, "patd exited before READY=1:\n" + s.text())
        sock = os.path.join(self.rundir, name + ".sock")
        print("\n  %s READY=1 STATUS=%s" % (name, status), end=" ", flush=True)
        self.assertIn("serving on %s (%s backend" % (sock, EXPECT), status, s.text())
        st = patctl_status(sock)
        self.assertEqual(st.get("backend"), EXPECT, st)
        self.assertEqual(int(st["pid"]), s.pid)
        if EXPECT == "cuda":
            self.assertIn("(cuda:0, sm_", st.get("device", ""), st)
        else:
            self.assertIn("host CPUs", st.get("device", ""), st)
            # one notice that says why not cuda, and nothing louder
            notices = [ln for ln in s.text().splitlines() if "backend auto:" in ln]
            self.assertEqual(len(notices), 1, s.text())
            self.assertTrue(notices[0].startswith("<5>"), notices[0])
            self.assertRegex(notices[0], "no NVIDIA driver|no cuda backend")
        page = scrape(port)
        self.assertRegex(page, r'patd_build_info\{[^}]*backend="%s"[^}]*\} 1' % EXPECT)
        return st

    def test_patd_service(self):
        """patd.service with the shipped patd.conf: the backend auto picks, on the metrics port
        the config names; a clean stop."""
        s = self.service("patd.service").start()
        self.assertIn("--config", s.argv)
        self.check_serving(s, "patd", self.port)
        self.assertEqual(s.stop(), 0, s.text())

    def test_two_instances(self):
        """patd@0 and patd@1 side by side from one shared config: distinct sockets, metrics ports
        metrics_port + N, both serving."""
        env1 = None
        if EXPECT == "cuda":
            for n in ("0", "1"):
                self.staged.dropin(n, "[gpu]\nmemory_fraction = 0.3\n")
            env1 = {"CUDA_VISIBLE_DEVICES": "0"}  # the one GPU stands for GPU 1
        a = self.service("patd@.service", "0").start()
        b = self.service("patd@.service", "1", env1).start()
        self.assertEqual(a.env["CUDA_VISIBLE_DEVICES"], "0")
        self.assertEqual(a.env.get("CUDA_DEVICE_ORDER"), "PCI_BUS_ID")
        sa = self.check_serving(a, "patd@0", self.port)
        sb = self.check_serving(b, "patd@1", self.port + 1)
        self.assertNotEqual(sa["instance"], sb["instance"])
        if EXPECT == "cuda":
            self.assertIn("+ %s/patd@1.conf" % self.staged.etc, b.text(), "drop-in read")
        self.assertEqual(a.stop(), 0, a.text())
        self.assertEqual(b.stop(), 0, b.text())

    def test_missing_gpu_stops(self):
        """patd@1 with its unit's CUDA_VISIBLE_DEVICES=1 on a one-GPU host: it stops at start and
        says why, instead of serving from the CPU."""
        if EXPECT != "cuda" or gpus_on_host() != 1:
            self.skipTest("needs a host with exactly one GPU")
        s = self.service("patd@.service", "1").start()
        self.assertIsNone(s.ready(), "patd@1 served without its GPU:\n" + s.text())
        self.assertNotEqual(s.exit_status(5), 0)
        self.assertRegex(s.text(), r"no CUDA device 0: this process sees 0 "
                         r"\(CUDA_VISIBLE_DEVICES=1; the driver has 1 GPU on this host\)")
        self.assertIn("not falling back to the cpu backend", s.text())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--expect", choices=("cpu", "cuda"), default="cpu")
    args, rest = ap.parse_known_args()
    EXPECT = args.expect
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

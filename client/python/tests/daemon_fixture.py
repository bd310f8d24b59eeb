"""A real patd for a test class: started by setUpClass in a private runtime directory, drained
with SIGTERM by tearDownClass (its exit status must be 0)."""

import os
import signal
import subprocess
import tempfile
import time

import patd

BIN = os.environ.get("PATD_BIN", "build/bin/patd")


def start_daemon(owner, prefix, args, metrics_port=0):
    """Starts patd with args (beyond its runtime directory and metrics_port: 0, metrics off) and
    waits until it answers; sets owner.dir, .sock, .log and .proc."""
    owner.dir = tempfile.mkdtemp(prefix=prefix)
    owner.sock = os.path.join(owner.dir, "patd.sock")
    owner.log = open(os.path.join(owner.dir, "patd.log"), "w")
    owner.proc = subprocess.Popen([BIN, "--runtime-dir=" + owner.dir,
                                   "--metrics-port=%d" % metrics_port] + args, stderr=owner.log)
    for _ in range(200):
        try:
            patd.admin("status", socket=owner.sock, timeout_ms=200)
            return
        except (patd.PatError, OSError):
            time.sleep(0.025)
    raise RuntimeError("patd did not start")


def stop_daemon(owner):
    owner.proc.send_signal(signal.SIGTERM)
    assert owner.proc.wait(timeout=5) == 0
    owner.log.close()
    subprocess.run(["rm", "-rf", owner.dir], check=False)

"""Test helpers shared by the Python tests that start patd with its metrics endpoint."""

import os
import socket


def free_port():
    """A loopback TCP port nothing holds now, below the kernel's ephemeral range, where the
    outgoing connections of anything else on the host (a socket fuzzer's millions) never land
    between this check and patd's bind."""
    for i in range(2000):
        port = 20000 + (os.getpid() * 7 + i * 13) % 12000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port in 20000-31999")

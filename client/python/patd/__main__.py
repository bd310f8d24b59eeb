"""python3 -m patd [--version] [--socket PATH]: what this binding talks to.

Prints the binding's version, the libpat it loaded (version and path), and, when a daemon
answers on the socket (default: pat_default_socket()), its release, wire protocol, backend and
model. Exit status 0, or 1 when no daemon answered.
"""

import argparse
import sys

import patd


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m patd", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="store_true", help="print versions (the default)")
    ap.add_argument("--socket", help="patd's control socket (default: %(default)s)",
                    default=patd.default_socket())
    ap.add_argument("--timeout-ms", type=int, default=2000)
    a = ap.parse_args(argv)
    print("patd binding %s" % patd.__version__)
    print("libpat %d.%d.%d (%s)" % (patd.library_version() + (patd.library_path(),)))
    try:
        st = patd.status(socket=a.socket, timeout_ms=a.timeout_ms)
    except patd.PatError as e:
        import errno
        why = "nothing listens there" if e.errno == errno.ENOENT else str(e)
        print("daemon: none at %s (%s)" % (a.socket, why))
        return 1
    v = st["version"]
    m = st["model"]
    print("daemon %d.%d.%d, wire protocol %d, pid %d, %s backend, model %d layers %d/%d heads "
          "d%d at %s" % (v >> 16, (v >> 8) & 0xff, v & 0xff, st["protocol"], st["pid"],
                         st["backend"], m["n_layers"], m["q_heads"], m["kv_heads"],
                         m["head_dim"], a.socket))
    return 0


if __name__ == "__main__":
    sys.exit(main())

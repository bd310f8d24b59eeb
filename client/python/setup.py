"""Builds the patd package with libpat inside it, so that a wheel works on its own.

`pip install client/python` builds a local directory in place (pip >= 21.3), in this patd
source tree. The build step runs the Makefile's own rule for libpat into a directory of the
build (`make CUDA=0 B=<build_temp>/libpat <that>/lib/libpat.so.1`): the same sources and flags
as build/lib's libpat, written once, in the Makefile. The library goes into the package beside
__init__.py as libpat.so.<major> (soname libpat.so.<major>), where the binding looks first after
PATD_LIBPAT. The package's version and the binding's __version__ are client/pat.h's
PAT_VERSION_*: read by patd/_version.py, and written into the built package as a literal.

Build needs: a C compiler and make (Debian: build-essential); each missing one stops the build
naming its package. Run needs: the C library only (libpat speaks patd's own Unix sockets).
The wheel is platform-specific (it carries machine code).
"""

import glob
import importlib.util
import os
import shlex
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))  # the patd source tree, when in one


def fail(msg):
    raise SystemExit("error: patd: " + msg)


if not (os.path.isfile(os.path.join(ROOT, "Makefile"))
        and os.path.isfile(os.path.join(ROOT, "client", "pat_client.c"))):
    fail("patd's C sources are not at %s (this directory is not client/python of a patd source "
         "tree; an sdist carries only the binding): the package compiles libpat from them, so "
         "build it from a checkout: pip install --no-build-isolation <checkout>/client/python"
         % ROOT)

_spec = importlib.util.spec_from_file_location("_patd_version", os.path.join(HERE, "patd",
                                                                             "_version.py"))
_ver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ver)
VERSION = _ver.__version__
LIBPAT = "libpat.so.%s" % VERSION.split(".")[0]


def build_libpat(out):
    """Builds libpat with the Makefile's rule, its build directory at out (kept between builds:
    make rebuilds what changed). Returns the library's path; ends the build with a message
    naming the missing Debian package when a need is missing."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    if not shutil.which(cc[0]) or not shutil.which("make"):
        fail("libpat is compiled from this tree's C sources: it needs a C compiler (%s) and make "
             "(Debian: apt install build-essential)" % cc[0])
    # the package's own build: no knob of an enclosing make (make run-tests, DEBUG=1) leaks in
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    lib = os.path.join(out, "lib", LIBPAT)
    cmd = ["make", "-C", ROOT, "--no-print-directory", "-j%d" % len(os.sched_getaffinity(0)),
           "CUDA=0", "DEBUG=", "B=" + out, lib]
    print(" ".join(cmd), flush=True)
    if subprocess.run(cmd, env=env).returncode != 0:
        fail("libpat did not build (make's output above)")
    return lib


class BuildPy(build_py):
    """build_py, then libpat and the literal version module into the built package."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "patd")
        temp = self.get_finalized_command("build").build_temp
        lib = build_libpat(os.path.abspath(os.path.join(temp, "libpat")))
        for old in glob.glob(os.path.join(pkg, "libpat.so.*")):  # an earlier build's major
            os.remove(old)
        shutil.copyfile(lib, os.path.join(pkg, LIBPAT))  # the file, not make's soname link
        os.chmod(os.path.join(pkg, LIBPAT), 0o755)
        with open(os.path.join(pkg, "_version.py"), "w", encoding="utf-8") as f:
            f.write("# PAT_VERSION_* of client/pat.h, written by setup.py (patd/_version.py says "
                    "why)\n__version__ = \"%s\"\n" % VERSION)


class PlatformDistribution(Distribution):
    """libpat is machine code: the wheel is tagged for this platform, not pure Python."""

    def has_ext_modules(self):
        return True


setup(version=VERSION, cmdclass={"build_py": BuildPy}, distclass=PlatformDistribution)

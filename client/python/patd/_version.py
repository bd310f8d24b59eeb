"""The binding's version: client/pat.h's PAT_VERSION_MAJOR/MINOR/PATCH, the one definition of
patd's release (libpat's soname, pat.pc, `patd --version` and this package derive from it).

Run from a source tree, this module reads pat.h two directories up. A built package has no pat.h
beside it: setup.py (the wheel) and `make install` put in its place a module holding the version
they read from pat.h as a literal, so __version__ means the same everywhere.
"""

import os
import re


def read_pat_h(path):
    """(major, minor, patch) from the pat.h at path. Raises OSError when there is none,
    ValueError when one of the three macros is missing."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define PAT_VERSION_%s\s+(\d+)\b" % name, text, re.MULTILINE)
        if not m:
            raise ValueError("%s: no #define PAT_VERSION_%s" % (path, name))
        parts.append(int(m.group(1)))
    return tuple(parts)


PAT_H = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                      "pat.h"))
__version__ = "%d.%d.%d" % read_pat_h(PAT_H)

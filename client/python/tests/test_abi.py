"""The ctypes mirror of libpat's ABI structs (patd/__init__.py) against the C compiler's view
of client/pat.h, and the binding's version against the header's.

pat_abi_layout (built by the Makefile from pat_abi_layout.c) prints every ABI struct's size
and each field's offset and size; PATD_ABI_LAYOUT names it (test_python.sh sets it). A field
added, moved, resized or renamed on either side fails here, and so does a struct in pat.h that
neither the layout program nor the binding covers.

Run: PATD_ABI_LAYOUT=build/tests/pat_abi_layout PATD_LIBPAT=build/lib/libpat.so.1 python3 -m
     unittest discover -s client/python/tests   (make test does this)
"""

import ctypes
import json
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import patd  # noqa: E402

PAT_H = os.path.join(HERE, "..", "..", "pat.h")
LAYOUT = os.environ.get("PATD_ABI_LAYOUT", "build/tests/pat_abi_layout")

# C struct -> its ctypes mirror. A struct added to pat.h must be added here (the test says so).
MIRRORS = {
    "pat_model_t": patd._Model,
    "pat_connect_opts_t": patd._ConnectOpts,
    "pat_buffers_t": patd._Buffers,
    "pat_step_info_t": patd._StepInfo,
    "pat_conn_stats_t": patd._ConnStats,
    "pat_status_t": patd._Status,
}


def c_layout():
    out = subprocess.run([LAYOUT], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


class AbiCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(LAYOUT, os.X_OK):
            raise RuntimeError("%s not built (make all builds it; PATD_ABI_LAYOUT names it)"
                               % LAYOUT)
        cls.c = c_layout()

    def test_every_struct_of_pat_h_is_covered(self):
        with open(PAT_H) as f:
            text = f.read()
        in_header = set(re.findall(r"typedef struct \w+ \{.*?\} (\w+);", text, re.S))
        self.assertTrue(in_header, "no struct found in pat.h: the pattern is stale")
        self.assertEqual(in_header, set(self.c["structs"]),
                         "pat.h's structs vs pat_abi_layout.c's table")
        self.assertEqual(in_header, set(MIRRORS), "pat.h's structs vs this test's MIRRORS")

    def test_c_table_lists_every_field(self):
        # the fields the layout program lists must tile the struct: a gap is a field of pat.h
        # missing from its table (or padding, which an ABI struct should not have either)
        for name, s in self.c["structs"].items():
            end = 0
            for field, (off, size) in sorted(s["fields"].items(), key=lambda kv: kv[1][0]):
                self.assertEqual(off, end, "%s: a gap of %d bytes before %s"
                                 % (name, off - end, field))
                end = off + size
            self.assertEqual(end, s["size"], "%s: %d bytes after the last field listed"
                             % (name, s["size"] - end))

    def test_ctypes_mirror_matches_c(self):
        for name, s in self.c["structs"].items():
            with self.subTest(struct=name):
                py = MIRRORS[name]
                py_fields = [f[0] for f in py._fields_]
                self.assertEqual(sorted(py_fields), sorted(s["fields"]),
                                 "%s: fields in %s vs pat.h" % (name, py.__name__))
                for field, (off, size) in s["fields"].items():
                    d = getattr(py, field)
                    self.assertEqual((d.offset, d.size), (off, size),
                                     "%s.%s: (offset, size) in Python vs C" % (name, field))
                self.assertEqual(ctypes.sizeof(py), s["size"], "sizeof(%s)" % name)

    def test_versions_agree(self):
        want = tuple(self.c["version"])
        self.assertEqual(patd.library_version(), want,
                         "the libpat loaded (%s) is not the one pat.h describes"
                         % os.environ.get("PATD_LIBPAT", "default search"))
        if hasattr(patd, "__version__"):
            self.assertEqual(patd.__version__, "%d.%d.%d" % want)


if __name__ == "__main__":
    unittest.main()

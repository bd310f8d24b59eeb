#!/usr/bin/env python3
"""Checks README.md's demo sample against the report of a real demo run (test_demo.sh).

The sample stays plain text for a person: the block of 4-space-indented lines that follows the
README's lead-in line LEAD_IN (after one blank line) and ends at the first line that is not
indented. It stands for the last lines of the client demo's report, those ending with its verdict
line ("demo: OK"), and must equal them line for line, character for character, except in the
fields VARYING lists.

VARYING holds the figures a run measures rather than computes: wall-clock time, different on
every run. Each row is a pattern for a whole line with one group, the varying field; where a
README line and its run line both match the row, that field is left out of the comparison (and
must be a number in both). Everything else the demo prints follows from its seeds and the code:
prompt and cache-hit token counts, rows checked, KV bytes, pack reuse, and the rounding errors
(the cpu backend has no timing- or CPU-dependent arithmetic; measured identical across runs, on
an idle and a loaded machine, and in the -O0 ASan build). A change of any of those is a change
the README must show, so it fails here. The cache figures hold because every client opens its
first batch before any prefill of another client commits (the scope is one user's).

Usage: readme_sample.py README.md DEMO_OUTPUT   exit 0 on a match, 1 with a diff on stdout
"""

import difflib
import re
import sys

LEAD_IN = "A demo run ends with:"
VERDICT = re.compile(r"^demo: (OK|FAILED)$")
VARYING = [
    # the daemon's measured step latency (pat_step_info_t), a mean of wall-clock times
    re.compile(r"^daemon step latency \(.*\): mean ([0-9]+\.[0-9]+) ms$"),
]
HIDDEN = "<varies>"


def sample(readme):
    """The README's sample lines (indentation removed); exits 1 when it cannot be found."""
    lines = readme.splitlines()
    try:
        at = lines.index(LEAD_IN)
    except ValueError:
        sys.exit("readme_sample: README has no line %r" % LEAD_IN)
    if at + 2 >= len(lines) or lines[at + 1] != "" or not lines[at + 2].startswith("    "):
        sys.exit("readme_sample: %r is not followed by a blank line and an indented block"
                 % LEAD_IN)
    block = []
    for ln in lines[at + 2:]:
        if not ln.startswith("    "):
            break
        block.append(ln[4:])
    return block


def report(output, n):
    """The n lines of the demo's output that end with its verdict line."""
    lines = output.splitlines()
    ends = [i for i, ln in enumerate(lines) if VERDICT.match(ln)]
    if not ends:
        sys.exit("readme_sample: the demo's output has no verdict line (demo: OK / FAILED)")
    return lines[max(0, ends[-1] + 1 - n):ends[-1] + 1]


def masked(line):
    for pat in VARYING:
        m = pat.match(line)
        if m:
            return line[:m.start(1)] + HIDDEN + line[m.end(1):]
    return line


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.rstrip().splitlines()[-1])
    with open(sys.argv[1], encoding="utf-8") as f:
        want = sample(f.read())
    with open(sys.argv[2], encoding="utf-8") as f:
        got = report(f.read(), len(want))
    a, b = [masked(x) for x in want], [masked(x) for x in got]
    if a == b:
        print("readme_sample: README.md's demo sample (%d lines) matches this run (%s masked)"
              % (len(want), HIDDEN))
        return 0
    print("readme_sample: README.md's demo sample differs from this run (%s: measured, not "
          "compared); update the sample to the run:" % HIDDEN)
    sys.stdout.writelines(difflib.unified_diff([x + "\n" for x in a], [x + "\n" for x in b],
                                               "README.md sample", "this run"))
    return 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Every repository path the docs name exists: src/, tests/, bench/, tools/, include/, python/,
workloads/ paths of files (with an extension) in README.md, docs/*.md and include/*.h. A file that
moves (the layer layout moved src/*.c into src/<layer>/) leaves docs that send readers nowhere;
this check fails on each such reference with file:line.

usage: tools/docs_paths_check.py [ROOT]   (exit 0: all found; 1: missing ones listed)
"""
import glob
import os
import re
import sys

PATH = re.compile(r"(?<![\w/.-])((?:src|tests|bench|tools|include|python|workloads|fuzz|stress)/"
                  r"[A-Za-z0-9_./+-]*[A-Za-z0-9_]\.(?:c|h|cpp|py|md|sh|csv|txt|json))\b")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    files += sorted(glob.glob(os.path.join(root, "include", "*.h")))
    bad = 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                for m in PATH.finditer(line):
                    p = m.group(1)
                    if "*" in p or "<" in p or not os.path.exists(os.path.join(root, p)):
                        if "*" in p or "<" in p:
                            continue
                        print("%s:%d: %s does not exist" % (os.path.relpath(f, root), n, p))
                        bad += 1
    print("docs_paths_check: %d file(s) read, %d missing path(s)" % (len(files), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

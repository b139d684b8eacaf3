#!/usr/bin/env python3
"""Checks that the code does not cite issue numbers (the word "issue" and a number): a comment
says what the code does and why, and the history of how it came to be lives in git.
Reads the project's sources and scripts (C++, CUDA, proto, CMake, Python, JavaScript,
shell) under --root, skipping build folders and this checker's own test data. Exit
status 0 when none cites one, 1 otherwise (each file:line printed).
"""
import argparse
import os
import re
import sys

EXTENSIONS = (".h", ".cc", ".cu", ".cuh", ".proto", ".cmake", ".py", ".js", ".sh", ".in",
              ".html", ".css")
CITATION = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)
SKIP_DIRS = {".git", "build", "node_modules", ".gpu"}
THIS_TESTDATA = os.path.join("tests", "docs", "testdata")


def sources(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS
                             and not d.startswith("build-")
                             and os.path.join(rel, d) != THIS_TESTDATA)
        for f in sorted(filenames):
            if f.endswith(EXTENSIONS) or f == "CMakeLists.txt":
                yield os.path.join(dirpath, f)


def citations(root):
    found = []
    for path in sources(root):
        with open(path, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if CITATION.search(line):
                    found.append(f"{os.path.relpath(path, root)}:{n}: {line.strip()}")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = ap.parse_args()
    found = citations(os.path.abspath(args.root))
    for f in found:
        print(f"cites an issue number: {f}")
    print(f"{len(found)} citations of issue numbers in the code")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks the folders' dependencies against the table in docs/ARCHITECTURE.md: every
`#include "..."` of the project's own headers in common/, stage_server/, coordinator/,
client/ and bench/ must go to the including file's own folder or to one the table
allows that folder, the table itself must have no cycle, and every folder that holds
sources must have a row. So a new include that ties two folders together, or a file
put where its folder may not depend, fails here instead of growing a knot.

The table is the fenced block marked `folders` in the document: one line a folder,
`FOLDER: DEP DEP ...` (a folder with no dependency lists none), `#` starting a comment.
An include of a generated header (`pipetrain/v1/...`) is a dependency on proto.

It also checks the sizes the layout promises: at most 12 source files at the top of
stage_server/ and coordinator/, and at most 16 in any folder but the ones SIZE_EXCEPTIONS
names. Exit status 0 when all holds, 1 otherwise (each failure printed).
"""
import argparse
import os
import re
import sys

SOURCE_ROOTS = ("common", "stage_server", "coordinator", "client", "bench")
SOURCE_EXTENSIONS = (".h", ".cc", ".cu", ".cuh")
TOP_LIMIT = {"stage_server": 12, "coordinator": 12}
FOLDER_LIMIT = 16
# Folders that hold more than FOLDER_LIMIT sources and are not split yet.
SIZE_EXCEPTIONS = {"common", "common/model", "common/data", "stage_server/compute",
                   "coordinator/planner", "client", "bench"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_table(path):
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(r"```folders\n(.*?)```", text, flags=re.S)
    if not m:
        return None
    table = {}
    for line in m.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        folder, _, deps = line.partition(":")
        table[folder.strip()] = set(deps.split())
    return table


def project_folder(include):
    """The folder of an included project header, or None for a library's header."""
    if include.startswith("pipetrain/v1/"):
        return "proto"
    if include.split("/")[0] in SOURCE_ROOTS + ("tests",):
        return os.path.dirname(include)
    return None


def sources(root):
    for top in SOURCE_ROOTS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(SOURCE_EXTENSIONS):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def find_cycle(table):
    state = {}

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for dep in sorted(table.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if not state.get(dep):
                cycle = visit(dep, path)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(table):
        if not state.get(node):
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def check(root, table):
    failures = []
    cycle = find_cycle(table)
    if cycle:
        failures.append("the table has a cycle: " + " -> ".join(cycle))
    counts = {}
    for path in sources(root):
        folder = os.path.dirname(path)
        counts[folder] = counts.get(folder, 0) + 1
        if folder not in table:
            failures.append(f"{path}: its folder {folder}/ has no row in the table")
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
            includes = INCLUDE.findall(fh.read())
        for inc in includes:
            dep = project_folder(inc)
            if dep is None or dep == folder or dep in table[folder]:
                continue
            failures.append(f"{path} includes {inc}: {folder}/ may not depend on {dep}/")
    for folder in sorted(table):
        if folder != "proto" and folder not in counts:
            failures.append(f"the table names {folder}/, which holds no source file")
    for folder, n in sorted(counts.items()):
        limit = TOP_LIMIT.get(folder, None if folder in SIZE_EXCEPTIONS else FOLDER_LIMIT)
        if limit is not None and n > limit:
            failures.append(f"{folder}/ holds {n} source files, more than {limit}")
    return failures, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--doc", default="docs/ARCHITECTURE.md")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    table = read_table(os.path.join(root, args.doc))
    if table is None:
        print(f"{args.doc}: no ```folders block (the table of allowed dependencies)")
        return 1
    failures, counts = check(root, table)
    for f in failures:
        print(f"{args.doc}: {f}")
    edges = sum(len(d) for d in table.values())
    print(f"{args.doc}: {len(counts)} folders, {sum(counts.values())} sources, "
          f"{edges} allowed dependencies, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

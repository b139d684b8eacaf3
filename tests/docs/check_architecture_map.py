#!/usr/bin/env python3
"""Checks docs/ARCHITECTURE.md against the code: every file path and every code symbol
it names in backticks must exist, so the map cannot keep naming what was renamed or
removed (it once named RefuseReplicasNotYetRun long after that function had gone).

A backticked token is
  - a path when it starts with one of the repository's top-level folders (common/,
    coordinator/, ...): it must exist; `{h,cc}` expands to each, and an all-capitals
    placeholder segment (NAME, JOB, STATE_DIR) matches anything;
  - a code symbol when it looks like one (`A::B`, `PascalCase`, `snake_case_name`,
    `kConstant`, optionally with `()`): each part must appear as a whole word in some
    source file (C++, CUDA, proto, CMake, Python, JavaScript, shell);
  - anything else (commands, flags, JSON fields, action text such as `F3`): not checked.
Exit status 0 when every checked token resolves, 1 otherwise (each failure printed).
"""
import argparse
import glob
import itertools
import os
import re
import sys

SOURCE_EXTENSIONS = (".h", ".cc", ".cu", ".cuh", ".proto", ".cmake", ".txt", ".py", ".js",
                     ".sh", ".in")
SYMBOL = re.compile(r"^~?[A-Za-z_][A-Za-z0-9_]*(::~?[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")


def top_folders(root):
    return sorted(d for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d)) and not d.startswith(".")
                  and d != "build" and not d.startswith("build-"))


def backticked(text):
    # Fenced code blocks are pictures and commands, not references.
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


def expand_braces(token):
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for part in m.group(1).split(","):
        out.extend(expand_braces(token[:m.start()] + part + token[m.end():]))
    return out


def path_exists(root, token):
    for candidate in expand_braces(token.rstrip("/")):
        segments = candidate.split("/")
        pattern = "/".join(
            re.sub(r"[A-Z][A-Z0-9_]*[A-Z0-9]", "*", s) if re.search(r"[A-Z]{3,}", s) else s
            for s in segments)
        # A unit named without its extension (`common/grpc_status`) is its .h/.cc pair.
        if not glob.glob(os.path.join(root, pattern)) and \
                not glob.glob(os.path.join(root, pattern + ".*")):
            return False
    return True


def looks_like_symbol(token):
    if not SYMBOL.match(token):
        return False
    name = token.removesuffix("()")
    if "::" in name or name.endswith("_"):
        return True
    last = name.split("::")[-1].lstrip("~")
    if PLACEHOLDER.match(last):
        return False  # NAME, ID: placeholders in prose
    if re.match(r"^k[A-Z]", last):
        return True  # kConstant
    if re.match(r"^[A-Z][a-z0-9]+[A-Z]", last):
        return True  # PascalCase with two words at least
    if "_" in last and last.lower() == last:
        return True  # snake_case_name
    return False


C_LIKE = (".h", ".cc", ".cu", ".cuh", ".proto", ".js", ".in")


def without_comments(name, text):
    # A name that survives only in a comment is what this check exists to catch.
    if name.endswith(C_LIKE):
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        return re.sub(r"//[^\n]*", " ", text)
    return re.sub(r"(^|\s)#[^\n]*", " ", text)


def source_words(root):
    words = set()
    me = os.path.abspath(__file__)
    skip = {".git", "build", "node_modules"}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.startswith("build-")]
        for f in filenames:
            path = os.path.join(dirpath, f)
            if (f.endswith(SOURCE_EXTENSIONS) or f == "CMakeLists.txt") and \
                    os.path.abspath(path) != me:
                try:
                    with open(path, encoding="utf-8", errors="replace") as fh:
                        text = without_comments(f, fh.read())
                    words.update(re.findall(r"~?[A-Za-z_][A-Za-z0-9_]*", text))
                except OSError:
                    pass
    return words


def check(root, doc):
    with open(os.path.join(root, doc), encoding="utf-8") as fh:
        tokens = backticked(fh.read())
    folders = top_folders(root)
    words = None
    failures, paths, symbols = [], 0, 0
    for token in dict.fromkeys(tokens):  # once each, in order
        t = token.strip()
        first = t.split("/")[0]
        if "/" in t and (first in folders or first == ".."):
            if first == "..":
                continue  # outside the repository: not checked
            paths += 1
            if not path_exists(root, t):
                failures.append(f"path `{t}` does not exist")
            continue
        if looks_like_symbol(t):
            if words is None:
                words = source_words(root)
            symbols += 1
            parts = [p.lstrip("~") for p in t.removesuffix("()").split("::")]
            missing = [p for p in parts if p not in words]
            if missing:
                failures.append(f"symbol `{t}`: {', '.join(missing)} not found in the source")
    return failures, paths, symbols


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--doc", default="docs/ARCHITECTURE.md")
    args = ap.parse_args()
    failures, paths, symbols = check(os.path.abspath(args.root), args.doc)
    for f in failures:
        print(f"{args.doc}: {f}")
    print(f"{args.doc}: {paths} paths and {symbols} symbols checked, {len(failures)} missing")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A structural check of deploy/docker/Dockerfile, since no Docker daemon (nor hadolint)
is at hand, and of the runtime stage's packages against what the built binaries load.

  check_dockerfile.py --root REPO BINARY...

Dockerfile: at least a build and a runtime stage; the runtime stage is not built FROM
the build stage or a devel image; COPY --from names an earlier stage; every COPY source
from the context exists and is not excluded by .dockerignore; install-deps.sh installs
the packages (--build-only, --runtime); the three binaries are copied into the runtime
stage, which runs as a non-root USER and EXPOSEs the ports the manifests use.
Runtime libraries: every shared library the given (built) binaries load comes from a
package that `install-deps.sh --runtime` installs, one of their dependencies, a package
every Debian image has (Priority: required), or the CUDA toolkit the Dockerfile adds.
"""
import argparse
import fnmatch
import os
import re
import shlex
import subprocess
import sys

problems = []
BINARIES = ("pipetrain", "pipetrain-coordinator", "pipetrain-stage")
PORTS = {"7400", "7401", "7410"}  # coordinator gRPC and HTTP, first stage (deploy/k8s)


def instructions(path):
    """(line number, INSTRUCTION, arguments) with continuations joined, comments dropped."""
    out, pending, start = [], "", 0
    with open(path) as f:
        for number, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if pending and line.lstrip().startswith("#"):
                continue
            if not pending:
                start = number
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            text = (pending + line).strip()
            pending = ""
            word, _, rest = text.partition(" ")
            out.append((start, word.upper(), rest.strip()))
    return out


def dockerignore(root):
    path = os.path.join(root, ".dockerignore")
    if not os.path.exists(path):
        problems.append(".dockerignore: missing (the build context would carry build/ and .git)")
        return []
    with open(path) as f:
        return [l.strip() for l in f if l.strip() and not l.startswith("#")]


def ignored(relative, patterns):
    """Whether .dockerignore keeps `relative` (or a folder above it) out of the context:
    the last matching pattern wins; `**/NAME` matches NAME at any depth."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, pattern[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes)
        if hit:
            result = not negate
    return result


def check_dockerfile(root):
    path = os.path.join(root, "deploy", "docker", "Dockerfile")
    where = "deploy/docker/Dockerfile"
    steps = instructions(path)
    patterns = dockerignore(root)
    stages = []  # [name, base, [(line, instruction, args)]]
    for line, word, args in steps:
        if word == "FROM":
            match = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", args, re.I)
            if not match:
                problems.append(f"{where}:{line}: cannot read FROM {args}")
                continue
            stages.append([match.group(2) or str(len(stages)), match.group(1), []])
        elif stages:
            stages[-1][2].append((line, word, args))
        elif word != "ARG":
            problems.append(f"{where}:{line}: {word} before the first FROM")
    if len(stages) < 2:
        problems.append(f"{where}: wants a build stage and a runtime stage, has {len(stages)}")
        return
    names = [s[0] for s in stages]
    runtime_name, runtime_base, runtime_steps = stages[-1]
    if runtime_base in names[:-1] or "devel" in runtime_base:
        problems.append(f"{where}: the runtime stage is FROM {runtime_base}: it would carry the "
                        "compilers; start from a runtime base")
    for index, (name, base, body) in enumerate(stages):
        for line, word, args in body:
            if word in ("COPY", "ADD"):
                words = shlex.split(args)
                options = [w for w in words if w.startswith("--")]
                sources = [w for w in words if not w.startswith("--")][:-1]
                source_stage = next((o.split("=", 1)[1] for o in options
                                     if o.startswith("--from=")), None)
                if source_stage is not None:
                    if source_stage not in names[:index]:
                        problems.append(f"{where}:{line}: COPY --from={source_stage} names no "
                                        "earlier stage")
                    continue
                for source in sources:
                    if "://" in source or source.startswith("$"):
                        continue  # a URL (ADD)
                    if source == ".":
                        continue
                    if not os.path.exists(os.path.join(root, source)):
                        problems.append(f"{where}:{line}: {word} {source}: not in the repository")
                    elif ignored(source, patterns):
                        problems.append(f"{where}:{line}: {word} {source}: excluded by "
                                        ".dockerignore")
    runs = {name: " ".join(a for _, w, a in body if w == "RUN") for name, _, body in stages}
    if not any("install-deps.sh --build-only" in r or re.search(r"install-deps\.sh(\s|$)", r)
               for n, r in runs.items() if n != runtime_name):
        problems.append(f"{where}: no build stage runs deploy/install-deps.sh")
    if "install-deps.sh --runtime" not in runs[runtime_name]:
        problems.append(f"{where}: the runtime stage does not run install-deps.sh --runtime")
    copied = " ".join(a for _, w, a in runtime_steps if w == "COPY")
    for binary in BINARIES:
        if not re.search(rf"/{re.escape(binary)}(\s|$)", copied):
            problems.append(f"{where}: the runtime stage does not COPY {binary}")
    users = [a for _, w, a in runtime_steps if w == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append(f"{where}: the runtime stage runs as root (add USER)")
    exposed = set(" ".join(a for _, w, a in runtime_steps if w == "EXPOSE").split())
    if not PORTS <= exposed:
        problems.append(f"{where}: EXPOSE {' '.join(sorted(exposed))}; the manifests use "
                        f"{' '.join(sorted(PORTS))}")
    ignored_paths = [p for p in ("build", ".git", "build-gpu") if not ignored(p, patterns)]
    if ignored_paths:
        problems.append(f".dockerignore: does not exclude {', '.join(ignored_paths)}")
    for needed in ("CMakeLists.txt", "proto", "common", "stage_server", "coordinator", "client",
                   "deploy/install-deps.sh"):
        if ignored(needed, patterns):
            problems.append(f".dockerignore: excludes {needed}, which the build needs")


def runtime_packages(root):
    with open(os.path.join(root, "deploy", "install-deps.sh")) as f:
        text = f.read()
    match = re.search(r"runtime_packages=\(([^)]*)\)", text)
    if not match:
        problems.append("deploy/install-deps.sh: no runtime_packages=(...) list")
        return []
    return re.sub(r"#.*", "", match.group(1)).split()


def check_runtime_libraries(root, binaries):
    """Every library the binaries load is installed by the runtime stage."""
    try:
        subprocess.run(["dpkg-query", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("note: no dpkg-query here; the runtime libraries were not checked")
        return
    listed = runtime_packages(root)
    depends = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + listed,
        capture_output=True, text=True).stdout
    # Every package the recursion visits is a line of its own, unindented.
    provided = set(listed) | {l.split(":")[0] for l in depends.splitlines()
                              if l and not l.startswith((" ", "<"))}
    priorities = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Priority}\n"],
                                capture_output=True, text=True).stdout.splitlines()
    required = {l.split()[0] for l in priorities if l.endswith(" required")}
    libraries = {}
    for binary in binaries:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        for line in out.splitlines():
            match = re.match(r"\s*(\S+) => (\S+)", line)
            if match:
                if match.group(2) == "not":
                    problems.append(f"{binary}: {match.group(1)} not found")
                else:
                    libraries[match.group(2)] = match.group(1)
    # Owners, in one dpkg-query call: a library's path as ldd gives it, its real path,
    # or the /usr one (Debian 12 merges /lib into /usr/lib).
    candidates = {}
    for path in libraries:
        for candidate in (path, os.path.realpath(path),
                          "/usr" + path if path.startswith("/lib") else path):
            candidates.setdefault(candidate, path)
    owners = {}
    out = subprocess.run(["dpkg-query", "-S"] + sorted(candidates), capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        package, _, owned = line.partition(": ")
        if owned in candidates:
            owners.setdefault(candidates[owned], package.split(":")[0].split(",")[0].strip())
    unowned = []
    for path, soname in sorted(libraries.items()):
        owner = owners.get(path)
        if owner is None:
            if "cuda" in path or soname.startswith(("libcu", "libnv")):
                continue  # the CUDA toolkit: cuda-cudart-*, libcublas-* in the Dockerfile
            unowned.append(path)
            continue
        if owner not in provided and owner not in required:
            problems.append(f"deploy/install-deps.sh: --runtime does not install {owner} "
                            f"({soname}, loaded by the binaries)")
    for path in unowned:
        problems.append(f"{path}: loaded by the binaries but no Debian package owns it")
    print(f"runtime libraries: {len(libraries)} loaded, runtime packages: {' '.join(listed)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("binaries", nargs="*")
    args = parser.parse_args()
    check_dockerfile(args.root)
    if args.binaries:
        check_runtime_libraries(args.root, args.binaries)
    if problems:
        print(f"{len(problems)} problem(s):")
        for p in problems:
            print(f"  {p}")
        return 1
    print("Dockerfile and runtime packages: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

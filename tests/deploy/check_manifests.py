#!/usr/bin/env python3
"""Checks the deployment files against each other and against the built binaries.

  check_manifests.py --root REPO --coordinator BIN --stage BIN --cli BIN
  check_manifests.py --root REPO --rendered FILE      (only the Kubernetes checks, on
                                                       `kubectl kustomize` output)

Kubernetes (deploy/k8s): kustomization.yaml lists every manifest; selectors match their
pods' labels; every Service port reaches a container port of the pods it selects, and
that port is the one the container's --listen/--http flag serves; probes are grpc:
probes on the plaintext --health-listen port (kubelet cannot present a client
certificate) and never ask for service "pipetrain.v1.Stage" (NOT_SERVING until configured);
a StatefulSet's serviceName is a headless Service selecting its pods; --coordinator
names the coordinator's Service and port; files given to flags lie on mounted volumes;
$(VAR) references are defined; a cuda stage asks for one nvidia.com/gpu.
systemd (deploy/systemd): the stage unit keeps the GPU reachable, uses its instance as
the GPU, restarts on failure, and every variable the units use is in pipetrain.env.
Everywhere (manifests, units, deploy/slurm/pipetrain.sbatch): every --flag given to a
pipetrain binary is in that binary's --help. Exit status 1 with every problem listed;
77 (CTest's skip code here) when PyYAML is missing.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is not installed (Debian: python3-yaml; deploy/install-deps.sh "
          "installs it)")
    sys.exit(77)

BINARIES = ("pipetrain", "pipetrain-coordinator", "pipetrain-stage")
problems = []


def problem(where, message):
    problems.append(f"{where}: {message}")


# ---- flags: what the binaries accept, and where the deployment files use them --------

class FlagCatalog:
    """The flags of each binary (and of each CLI verb), read from --help."""

    def __init__(self, paths):
        self.paths = paths  # binary name -> path of the built binary
        self.cache = {}

    def flags(self, binary, verb=None):
        key = (binary, verb)
        if key not in self.cache:
            command = [self.paths[binary]] + ([verb] if verb else []) + ["--help"]
            result = subprocess.run(command, capture_output=True, text=True, timeout=30)
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} exited {result.returncode}: "
                                   f"{result.stderr.strip()}")
            self.cache[key] = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)",
                                             result.stdout, re.M))
        return self.cache[key]


uses = []  # (binary, verb or None, flag, where)


def use_flags(binary, verb, tokens, where):
    for token in tokens:
        match = re.match(r"--([a-z0-9][a-z0-9-]*)(=|$)", token)
        if match:
            uses.append((binary, verb, match.group(1), where))


def binary_of(token):
    name = os.path.basename(token.strip("\"'"))
    return name if name in BINARIES else None


def strip_shell_comments(script):
    """The script without its comments: a `#` that starts a word outside quotes, to the
    end of its line (the newline stays: it ends the statement)."""
    out, quote, i = [], None, 0
    while i < len(script):
        ch = script[i]
        if quote is None and ch == "#" and (i == 0 or script[i - 1] in " \t\n;&|("):
            end = script.find("\n", i)
            i = len(script) if end < 0 else end
            continue
        if ch == "\\" and quote != "'" and i + 1 < len(script):
            out.append(script[i:i + 2])
            i += 2
            continue
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote == ch else ch
        out.append(ch)
        i += 1
    return "".join(out)


def is_operator(token):
    return token and all(ch in ";&|<>()\n" for ch in token)


def shell_invocations(script, where, annotations=True):
    """Records the flags of every pipetrain binary that a shell script runs, including
    inside `bash -c '...'`, and the `--flags` of the statement under a comment
    `# flags for: BIN[ VERB][, BIN VERB...]` (an array of flags given to those later)."""
    lines = script.split("\n")
    for i, line in enumerate(lines if annotations else []):
        match = re.match(r"\s*# flags for: (.+)$", line)
        if match:
            statement, depth = "", 0
            for next_line in lines[i + 1:]:
                statement += next_line + "\n"
                depth += next_line.count("(") - next_line.count(")")
                if depth <= 0 and not next_line.rstrip().endswith("\\"):
                    break
            # "BIN" or "BIN VERB", several separated by commas.
            for target in match.group(1).split(","):
                binary, _, verb = target.strip().partition(" ")
                use_flags(binary, verb or None,
                          re.findall(r"--[a-z0-9][a-z0-9-]*", statement),
                          f"{where} (flags for {target.strip()})")
    code = strip_shell_comments(script)
    lexer = shlex.shlex(code.replace("\\\n", " "), posix=True,
                        punctuation_chars=";&|<>()\n")
    lexer.whitespace = " \t\r"
    lexer.commenters = ""
    tokens = list(lexer)
    for i, token in enumerate(tokens):
        if token in ("bash", "sh", "/bin/sh", "/bin/bash") and tokens[i + 1:i + 2] == ["-c"]:
            shell_invocations(tokens[i + 2], where, annotations=False)
        binary = binary_of(token)
        previous = tokens[i - 1] if i > 0 else ""
        # Not a command: `command -v pipetrain`, or a flag's value (--state-dir /x/pipetrain).
        if not binary or previous == "-v" or (previous.startswith("-") and "=" not in previous):
            continue
        args = []
        for t in tokens[i + 1:]:
            if is_operator(t):
                break
            args.append(t)
        verb = None
        if binary == "pipetrain":
            verb = next((a for a in args if not a.startswith("-")), None)
        use_flags(binary, verb, args, where)


def check_flags(catalog):
    missing = {}
    for binary, verb, flag, where in uses:
        try:
            known = catalog.flags(binary, verb)
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            problem(where, str(error))
            continue
        if flag not in known:
            name = f"{binary} {verb}" if verb else binary
            missing.setdefault((name, flag), []).append(where)
    for (name, flag), wheres in sorted(missing.items()):
        problem(", ".join(sorted(set(wheres))), f"{name} has no --{flag} (not in its --help)")
    return missing


# ---- Kubernetes -----------------------------------------------------------------------

def load_k8s(root, rendered):
    k8s = os.path.join(root, "deploy", "k8s")
    docs = []
    if rendered:
        with open(rendered) as f:
            docs = [(rendered, d) for d in yaml.safe_load_all(f) if d]
        return docs
    with open(os.path.join(k8s, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    listed = kustomization.get("resources", [])
    present = sorted(n for n in os.listdir(k8s)
                     if n.endswith(".yaml") and n != "kustomization.yaml")
    for name in present:
        if name not in listed:
            problem(f"deploy/k8s/{name}", "not listed in kustomization.yaml resources")
    for name in listed:
        path = os.path.join(k8s, name)
        if not os.path.exists(path):
            problem("deploy/k8s/kustomization.yaml", f"lists {name}, which does not exist")
            continue
        with open(path) as f:
            docs += [(f"deploy/k8s/{name}", d) for d in yaml.safe_load_all(f) if d]
    return docs


def subset(small, big):
    return bool(small) and all(big.get(k) == v for k, v in small.items())


def container_flags(container):
    """--flag=value and --flag value forms of a container's command + args."""
    tokens = list(container.get("command", [])) + list(container.get("args", []))
    values = {}
    for i, token in enumerate(tokens):
        if not str(token).startswith("--"):
            continue
        token = str(token)
        if "=" in token:
            name, value = token[2:].split("=", 1)
        else:
            name = token[2:]
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            value = "" if str(following).startswith("--") else str(following)
        values[name] = value
    return tokens, values


def port_of(address):
    match = re.search(r":(\d+)$", address)
    return int(match.group(1)) if match else None


def resolve_port(container, port):
    """A probe's or Service's port (number or name) as a containerPort number."""
    for p in container.get("ports", []):
        if port in (p.get("name"), p.get("containerPort")):
            return p["containerPort"]
    return None


def check_k8s(docs):
    workloads = [(w, d) for w, d in docs if d.get("kind") in ("Deployment", "StatefulSet")]
    services = [(w, d) for w, d in docs if d.get("kind") == "Service"]
    services_by_name = {d["metadata"]["name"]: d for _, d in services}
    claims = {d["metadata"]["name"] for _, d in docs if d.get("kind") == "PersistentVolumeClaim"}
    if not workloads:
        problem("deploy/k8s", "no Deployment or StatefulSet found")
    for where, w in workloads:
        kind, name = w["kind"], w["metadata"]["name"]
        here = f"{where}: {kind}/{name}"
        spec = w["spec"]
        pod = spec["template"]
        labels = pod["metadata"].get("labels", {})
        if not subset(spec.get("selector", {}).get("matchLabels", {}), labels):
            problem(here, "selector.matchLabels is not a subset of the pod template's labels")
        if kind == "StatefulSet":
            headless = services_by_name.get(spec.get("serviceName"))
            if headless is None:
                problem(here, f"serviceName {spec.get('serviceName')!r} is no Service here")
            else:
                if headless["spec"].get("clusterIP") != "None":
                    problem(here, f"Service {headless['metadata']['name']} is not headless "
                                  "(clusterIP: None)")
                if not subset(headless["spec"].get("selector", {}), labels):
                    problem(here, "its headless Service does not select its pods")
        volumes = {v["name"] for v in pod["spec"].get("volumes", [])}
        for v in pod["spec"].get("volumes", []):
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None and claim not in claims:
                problem(here, f"volume {v['name']} claims {claim!r}, no PersistentVolumeClaim here")
        for c in pod["spec"]["containers"]:
            advertise = container_flags(c)[1].get("advertise")
            if kind == "StatefulSet" and advertise is not None:
                env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                       for e in c.get("env", [])}
                labels_of = advertise.split(".")
                pod_var = re.fullmatch(r"\$\((\w+)\)", labels_of[0])
                if (not pod_var or env.get(pod_var.group(1)) != "metadata.name"
                        or labels_of[1:2] != [spec.get("serviceName")]):
                    problem(here, f"--advertise {advertise}: want $(POD_NAME).{spec.get('serviceName')}"
                                  ".NAMESPACE.svc..., POD_NAME from metadata.name (the pod's "
                                  "stable DNS name)")
        for c in pod["spec"]["containers"]:
            check_container(f"{here} container {c['name']}", c, volumes, services_by_name)
    for where, s in services:
        here = f"{where}: Service/{s['metadata']['name']}"
        selected = [w for _, w in workloads
                    if subset(s["spec"].get("selector", {}),
                              w["spec"]["template"]["metadata"].get("labels", {}))]
        if not selected:
            problem(here, "its selector matches no Deployment's or StatefulSet's pods")
            continue
        for w in selected:
            containers = w["spec"]["template"]["spec"]["containers"]
            for p in s["spec"].get("ports", []):
                target = p.get("targetPort", p["port"])
                numbers = [resolve_port(c, target) for c in containers]
                number = next((n for n in numbers if n is not None), None)
                if number is None:
                    problem(here, f"port {p.get('name', p['port'])}: targetPort {target!r} is "
                                  f"no container port of {w['metadata']['name']}")
                elif number != p["port"]:
                    problem(here, f"port {p['port']} forwards to container port {number}; "
                                  "keep them equal (flags and docs use one number)")


def check_container(here, c, volumes, services_by_name):
    tokens, flags = container_flags(c)
    command = [str(t) for t in c.get("command", [])]
    binary = binary_of(command[0]) if command else None
    if binary is None:
        problem(here, f"command {command!r} does not run a pipetrain binary")
        return
    use_flags(binary, None, [str(t) for t in tokens], here)
    ports = {p["containerPort"] for p in c.get("ports", [])}
    for flag in ("listen", "http", "advertise", "health-listen"):
        if flag in flags:
            port = port_of(flags[flag])
            if port not in ports:
                problem(here, f"--{flag} {flags[flag]} uses port {port}, not a containerPort "
                              f"({sorted(ports)})")
    grpc_port = port_of(flags.get("listen", ""))
    if grpc_port is None:
        problem(here, "has no --listen HOST:PORT (the default listens on 127.0.0.1 only)")
    elif not flags["listen"].startswith(("0.0.0.0:", "[::]:")):
        problem(here, f"--listen {flags['listen']} is not reachable from other pods")
    if "advertise" in flags and port_of(flags["advertise"]) != grpc_port:
        problem(here, "--advertise and --listen name different ports")
    # The probes: grpc: probes on the plaintext health-only port (--health-listen), since
    # kubelet cannot present a client certificate to the mutual-TLS gRPC port; overall
    # health (service "").
    health_port = port_of(flags.get("health-listen", ""))
    if health_port is None:
        problem(here, "has no --health-listen HOST:PORT for the kubelet's grpc: probes")
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = c.get(probe_name)
        if probe is None:
            if probe_name != "startupProbe":
                problem(here, f"has no {probe_name}")
            continue
        kind = next((k for k in ("grpc", "tcpSocket", "httpGet", "exec") if k in probe), None)
        if kind == "grpc":
            port = resolve_port(c, probe[kind].get("port"))
            if port != health_port:
                problem(here, f"{probe_name} checks port {probe[kind].get('port')!r}, not the "
                              f"--health-listen port {health_port}")
            if kind == "grpc" and probe["grpc"].get("service", "") != "":
                problem(here, f"{probe_name} asks for service {probe['grpc']['service']!r}: "
                              "use the overall health (service \"\"); pipetrain.v1.Stage is "
                              "NOT_SERVING until a job configures the stage")
        else:
            problem(here, f"{probe_name} is {kind}, not a grpc: probe on the --health-listen "
                          "port")
    # --coordinator names the coordinator's Service and one of its ports.
    if "coordinator" in flags:
        host = flags["coordinator"].rsplit(":", 1)[0]
        service = services_by_name.get(host.split(".")[0])
        if service is None:
            problem(here, f"--coordinator {flags['coordinator']}: no Service named "
                          f"{host.split('.')[0]}")
        elif port_of(flags["coordinator"]) not in [p["port"] for p in service["spec"]["ports"]]:
            problem(here, f"--coordinator {flags['coordinator']}: Service "
                          f"{service['metadata']['name']} has no such port")
    # $(VAR) references: defined in env.
    env = {e["name"] for e in c.get("env", [])}
    for var in sorted({v for t in tokens for v in re.findall(r"\$\((\w+)\)", str(t))}):
        if var not in env:
            problem(here, f"$({var}) is used but not defined in env")
    # Files the flags name lie on mounted volumes.
    mounts = c.get("volumeMounts", [])
    for m in mounts:
        if m["name"] not in volumes:
            problem(here, f"mounts volume {m['name']!r}, which the pod does not declare")
    for flag in ("tls-cert", "tls-key", "tls-ca", "token-file", "state-dir", "data-root"):
        if flag in flags:
            path = flags[flag]
            if not any(path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
                       for m in mounts):
                problem(here, f"--{flag} {path} is on no mounted volume")
    # A cuda stage gets exactly one GPU, and uses it as cuda:0.
    device = flags.get("device", "")
    gpus = str(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", ""))
    if device.startswith("cuda:"):
        if gpus != "1":
            problem(here, f"--device {device} but limits nvidia.com/gpu is {gpus or 'unset'} "
                          "(want 1)")
        if device != "cuda:0":
            problem(here, f"--device {device}: a container sees its one GPU as cuda:0")


# ---- systemd --------------------------------------------------------------------------

def read_unit(path):
    """The unit's key=value lines (continuations joined), as a list of (section, key, value)."""
    entries, section, pending = [], None, ""
    with open(path) as f:
        for raw in f:
            line = pending + raw.rstrip("\n")
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            stripped = line.strip()
            if not stripped or stripped.startswith(("#", ";")):
                continue
            if stripped.startswith("["):
                section = stripped.strip("[]")
                continue
            key, _, value = stripped.partition("=")
            entries.append((section, key.strip(), value.strip()))
    return entries


def check_systemd(root):
    folder = os.path.join(root, "deploy", "systemd")
    env_file = os.path.join(folder, "pipetrain.env")
    defined = set()
    with open(env_file) as f:
        for line in f:
            match = re.match(r"\s*#?\s*([A-Z_][A-Z0-9_]*)=", line)
            if match:
                defined.add(match.group(1))
    units = sorted(n for n in os.listdir(folder) if n.endswith(".service"))
    for want in ("pipetrain-coordinator.service", "pipetrain-stage@.service"):
        if want not in units:
            problem("deploy/systemd", f"{want} is missing")
    for name in units:
        where = f"deploy/systemd/{name}"
        entries = read_unit(os.path.join(folder, name))
        keys = {}
        for section, key, value in entries:
            keys.setdefault(key, []).append(value)
        if keys.get("EnvironmentFile") != ["/etc/pipetrain/pipetrain.env"]:
            problem(where, "wants EnvironmentFile=/etc/pipetrain/pipetrain.env")
        if keys.get("Restart") != ["on-failure"]:
            problem(where, "wants Restart=on-failure")
        if keys.get("User", ["root"])[0] in ("root", "0"):
            problem(where, "runs as root; use the dedicated user pipetrain")
        for exec_start in keys.get("ExecStart", []):
            script = exec_start.replace("$$", "$")  # systemd's literal $
            if not re.match(r"/usr/local/bin/pipetrain|/bin/sh -c ", script):
                problem(where, f"ExecStart does not run /usr/local/bin/...: {script[:60]}")
            shell_invocations(script, where)
            for var in re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", script):
                if var not in defined and var not in ("CUDA_VISIBLE_DEVICES",):
                    problem(where, f"uses ${var}, which pipetrain.env does not define")
        if name.startswith("pipetrain-stage@"):
            if "CUDA_VISIBLE_DEVICES=%i" not in keys.get("Environment", []):
                problem(where, "wants Environment=CUDA_VISIBLE_DEVICES=%i (the instance is "
                               "the GPU index)")
            if not any("--device cuda:0" in v for v in keys.get("ExecStart", [])):
                problem(where, "wants --device cuda:0 (it sees only GPU %i)")
            for key, bad in (("PrivateDevices", "yes"), ("ProtectClock", "yes"),
                             ("MemoryDenyWriteExecute", "yes")):
                if bad in [v.lower() for v in keys.get(key, [])]:
                    problem(where, f"{key}={bad} keeps the stage from its GPU")
            if keys.get("DeviceAllow") or any(v in ("closed", "strict")
                                              for v in keys.get("DevicePolicy", [])):
                problem(where, "DeviceAllow=/DevicePolicy= close the device cgroup to "
                               "/dev/nvidia*")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--coordinator")
    parser.add_argument("--stage")
    parser.add_argument("--cli")
    parser.add_argument("--rendered", help="check this `kubectl kustomize` output instead")
    args = parser.parse_args()

    check_k8s(load_k8s(args.root, args.rendered))
    if not args.rendered:
        if not (args.coordinator and args.stage and args.cli):
            parser.error("--coordinator, --stage and --cli are needed without --rendered")
        check_systemd(args.root)
        with open(os.path.join(args.root, "deploy", "slurm", "pipetrain.sbatch")) as f:
            shell_invocations(f.read(), "deploy/slurm/pipetrain.sbatch")
        catalog = FlagCatalog({"pipetrain": args.cli, "pipetrain-coordinator": args.coordinator,
                               "pipetrain-stage": args.stage})
        missing = check_flags(catalog)
        checked = {(b, v, f) for b, v, f, _ in uses}
        print(f"checked {len(checked)} distinct flags of the pipetrain binaries in "
              "deploy/k8s, deploy/systemd and deploy/slurm")
        if missing:
            print("flags the deployment files use that the built binaries do not have:")
            for (name, flag) in sorted(missing):
                print(f"  {name} --{flag}")
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print(f"  {p}")
        return 1
    print("deployment files: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

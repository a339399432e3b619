#!/usr/bin/env python3
"""Checks deploy/k8s: renders it, validates every object against the
Kubernetes schemas, and checks the invariants the manifests' comments
promise. Run by k8s_test.sh (in its venv: kubernetes-validate, PyYAML).

    check_manifests.py REPO WORKDIR [--kubectl KUBECTL]

Renders deploy/k8s three times with kustomize_lite.py (beside this file):
as shipped ("base"), with components/writable-repository ("writable") and
with components/http-readiness ("http-readiness"). With --kubectl,
`kubectl kustomize` renders each too and must give the same objects. Every
object must validate, strictly (unknown fields are errors), against every
Kubernetes minor from MIN_KUBERNETES to the newest one kubernetes-validate
bundles. Each invariant is one named check; a failure
prints "FAIL <invariant>: <what is wrong>". The last line is
"N passed, M failed"; exit 1 when any check failed.

For the runtime checks of k8s_test.sh it also writes into WORKDIR:
  base/args             the server's args, one per line, $(VAR)s expanded as
                        the kubelet would, without --host, --grpc_port,
                        --http_port, --http_host, --metrics_port and
                        --model_repository
  base/repository/      the ConfigMap volume as the kubelet lays it out
                        (..data symlink, timestamped folder, items' paths)
  base/settings         shell assignments: DRAIN_NOTICE_MS, GRACE_PERIOD_MS,
                        TERMINATION_GRACE_S
  writable/seed.sh      the init container's script, its mount paths made
                        ${SEED_DIR} and ${MODELS_DIR}
  writable/seed/        the seed volume, laid out as base/repository
  http-readiness/settings  READY_PATH: the path the HTTP readinessProbe asks
"""
import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions
from packaging.version import Version

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
import kustomize_lite  # noqa: E402

# The oldest Kubernetes the manifests must be valid for (gRPC probes are GA
# since 1.27; PodDisruptionBudget.unhealthyPodEvictionPolicy is beta and on
# since 1.27, GA since 1.31).
MIN_KUBERNETES = "1.30"
# Time allowed, within the drain notice, for an endpoint change to reach
# every kube-proxy and load balancer after the readiness probe has failed.
ENDPOINT_PROPAGATION_S = 2.0
# attnserve waits at most this long after its grace period before exiting
# (server/main.cc: its drain, then 100 ms for the last responses).
SERVER_EXIT_SLACK_S = 0.5
# Kept between the server's longest drain and the kubelet's SIGKILL.
TERMINATION_MARGIN_S = 2.0
# Peak resident memory of one request in flight, in units of its message
# size: measured 0.55-0.65 GiB for a 234 MiB request (2.4-2.8x), 1.5 GiB for
# three at once (AMD EPYC, 2 workers).
PEAK_MEMORY_PER_MESSAGE = 2.5
# A ConfigMap's size limit (1 MiB, the API server's).
CONFIGMAP_LIMIT_BYTES = 1 << 20
MODEL_REPOSITORY_MOUNT = "/models"
# Flags that the runtime check sets itself (free ports, loopback, local dir).
RUNTIME_OWN_FLAGS = ("host", "grpc_port", "http_port", "http_host", "metrics_port",
                     "model_repository")
# What nginx itself may use of the front door's memory limit, beside its
# memory-backed volumes (~20 MiB idle: master and two workers).
NGINX_MEMORY_BYTES = 64 << 20
# KServe v2's readiness endpoint (docs/http.md): 200, or 503 while draining.
HTTP_READY_PATH = "/v2/health/ready"

SECURITY = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
}


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL %s%s" % (name, ": " + detail if detail else ""),
                  flush=True)
        return ok


def quantity(value):
    """A Kubernetes quantity ("2", "500m", "2Gi", "1e3") as a float."""
    text = str(value)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
             "Ei": 2**60, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
             "E": 1e18, "m": 1e-3}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def one(resources, kind):
    found = [r for r in resources if r["kind"] == kind]
    return found[0] if len(found) == 1 else None


def subset(labels, of):
    return bool(labels) and all(of.get(k) == v for k, v in labels.items())


def flag_values(args):
    """{flag: value} of --flag=value args (the last wins, as in absl)."""
    values = {}
    for arg in args:
        m = re.match(r"^--([A-Za-z0-9_]+)(?:=(.*))?$", arg)
        if m:
            values[m.group(1)] = m.group(2)
    return values


def server_view(server_flags, args):
    """{flag: value as text}: the server's integer defaults, overridden by
    ARGS (already expanded)."""
    flags = {k: str(v) for k, v in server_flags.items() if v is not None}
    flags.update(flag_values(args))
    return flags


def expand(text, env):
    """The kubelet's $(VAR) expansion ($$ escapes, unknown names stay)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$"
                  else env.get(m.group(1), m.group(0)), text)


def env_values(container):
    """The container's env as the kubelet resolves it here: literal values
    expanded in order, resourceFieldRef limits.cpu as whole cores."""
    env = {}
    limits = container.get("resources", {}).get("limits", {})
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        ref = (var.get("valueFrom") or {}).get("resourceFieldRef")
        if ref and ref.get("resource") in ("limits.cpu", "limits.memory"):
            limit = quantity(limits.get(ref["resource"].split(".")[1], "0"))
            divisor = quantity(ref.get("divisor", "1"))
            env[var["name"]] = str(int(-(-limit // divisor)))  # ceiling
    return env


def parse_dockerfile(path):
    """The final stage's USER, ENTRYPOINT, EXPOSE and useradd --uid."""
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    stage = re.split(r"(?m)^FROM\s", text)[-1]
    result = {"user": None, "entrypoint": None, "expose": set(), "useradd_uid": None,
              "front_door_conf": None}
    for line in stage.splitlines():
        words = line.split(None, 1)
        if not words:
            continue
        m = re.match(r"COPY\s+(?:--\S+\s+)*deploy/nginx/front-door\.conf\s+(\S+)", line)
        if m:
            result["front_door_conf"] = m.group(1)
        if words[0] == "USER":
            result["user"] = words[1].strip()
        elif words[0] == "ENTRYPOINT":
            result["entrypoint"] = json.loads(words[1])
        elif words[0] == "EXPOSE":
            result["expose"] |= {int(p.split("/")[0]) for p in words[1].split()}
        m = re.search(r"useradd\b.*--uid\s+(\d+)", line)
        if m:
            result["useradd_uid"] = int(m.group(1))
    return result


# nginx's tokens: a quoted string, a comment, { } ;, or a bare word.
NGINX_TOKEN = re.compile(r""""(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|#[^\n]*|[{};]"""
                         r"""|[^\s{};"'#][^\s{};]*""")


def parse_nginx(text):
    """An nginx configuration as nested lists of (name, [args], children),
    children None for a simple directive. Comments dropped, quotes removed."""
    root = []
    stack = [root]
    words = []
    for token in NGINX_TOKEN.findall(text):
        if token.startswith("#"):
            continue
        if token in (";", "{"):
            if not words:
                raise ValueError("nginx config: '%s' without a directive" % token)
            children = [] if token == "{" else None
            stack[-1].append((words[0], words[1:], children))
            if children is not None:
                stack.append(children)
            words = []
        elif token == "}":
            if words or len(stack) == 1:
                raise ValueError("nginx config: unbalanced '}'")
            stack.pop()
        else:
            words.append(token[1:-1] if token[:1] in "\"'" else token)
    if words or len(stack) != 1:
        raise ValueError("nginx config: unterminated directive or block")
    return root


def nginx_args(block, name):
    """The arguments of the last NAME directive in BLOCK, or None."""
    found = [args for n, args, _ in block or [] if n == name]
    return found[-1] if found else None


def nginx_blocks(block, name):
    return [(args, children) for n, args, children in block or []
            if n == name and children is not None]


def nginx_bytes(text):
    """An nginx size ("256m", "16k", "1g", "512") in bytes."""
    m = re.match(r"^(\d+)([kKmMgG]?)$", text or "")
    if not m:
        return None
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def nginx_seconds(text):
    """An nginx time ("300s", "1m", "500ms", "75") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    m = re.match(r"^(\d+)(ms|s|m|h|d)?$", text or "")
    return None if not m else int(m.group(1)) * units[m.group(2) or "s"]


def parse_front_door(path):
    """deploy/nginx/front-door.conf, read as nginx reads it: its listen ports,
    upstreams, the http block's directives, and the two proxying servers:
    "grpc" (the server whose location has grpc_pass) and "rest" (the one
    with proxy_pass), each with its listen ports, whether they speak
    HTTP/2, its upstream, that upstream's first server (host:port) and
    directives, and the server's and location's directives (each a list of
    (name, args, children))."""
    with open(path) as f:
        config = parse_nginx(f.read())
    http = (nginx_blocks(config, "http") or [([], [])])[0][1]
    upstreams = {args[0]: children for args, children in nginx_blocks(http, "upstream")}
    result = {"http": http, "upstreams": upstreams, "listen": set(),
              "grpc": None, "rest": None}
    for _, server in nginx_blocks(http, "server"):
        listens = [args for n, args, _ in server if n == "listen"]
        ports = set()
        for args in listens:
            m = re.match(r"^(?:[\d.]+:|\[[^\]]*\]:)?(\d+)$", args[0])
            if m:
                ports.add(int(m.group(1)))
        result["listen"] |= ports
        for _, location in nginx_blocks(server, "location"):
            for kind, directive, scheme in (("grpc", "grpc_pass", "grpc://"),
                                            ("rest", "proxy_pass", "http://")):
                target = nginx_args(location, directive)
                if not target:
                    continue
                name = target[0][len(scheme):] if target[0].startswith(scheme) else None
                upstream = upstreams.get(name)
                first = nginx_args(upstream, "server") if upstream is not None else None
                result[kind] = {
                    "listen": ports,
                    "http2": any("http2" in args[1:] for args in listens) or
                    nginx_args(server, "http2") == ["on"],
                    "pass": target[0], "upstream": upstream,
                    "target": first[0] if first else None,
                    "server": server, "location": location,
                }
    return result


def nginx_effective(name, *blocks):
    """NAME's arguments as nginx applies them in the innermost of BLOCKS
    (outermost first: http, server, location): the innermost that sets it."""
    value = None
    for block in blocks:
        value = nginx_args(block, name) or value
    return value


def probe_port(container, port):
    """A probe's port as the kubelet resolves it: a number, or a name looked
    up among the probed container's own ports only (else a number in a
    string); None when it does not resolve."""
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p.get("containerPort")
    return int(port) if isinstance(port, str) and port.isdigit() else None


def memory_volumes(pod, container):
    """{mountPath: sizeLimit in bytes (None: unlimited)} of CONTAINER's
    memory-backed emptyDir mounts."""
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    out = {}
    for m in container.get("volumeMounts") or []:
        empty = volumes.get(m["name"], {}).get("emptyDir")
        if empty is not None and empty.get("medium") == "Memory":
            limit = empty.get("sizeLimit")
            out[m["mountPath"]] = quantity(limit) if limit is not None else None
    return out


def integer_literal(text):
    """The value of a C++ integer default such as 1000, 256 << 20 or
    int64_t{1} << 26; None for anything else."""
    text = re.sub(r"\b\w+\{(\d+)\}", r"\1", text.strip())
    m = re.match(r"^(\d+)(?:\s*<<\s*(\d+))?$", text)
    return None if not m else int(m.group(1)) << int(m.group(2) or 0)


def parse_server_main(repo):
    """The server's flags {name: integer default or None} (server/flags.cc)
    and the service names its health service reports ("" included: the
    services server/main.cc hands the gRPC server, each under its name)."""
    with open(os.path.join(repo, "server", "flags.cc")) as f:
        text = f.read()
    flags = {name: integer_literal(default) for name, default in re.findall(
        r"ABSL_FLAG\(\s*[^,]+?\s*,\s*(\w+)\s*,\s*([^,]+?)\s*,", text)}
    with open(os.path.join(repo, "server", "main.cc")) as f:
        text = f.read()
    health = {""} | set(re.findall(r'\{"([\w.]+)",\s*&\w+\}', text))
    return flags, health


def model_files(folder):
    """{"<model>/<file>": bytes} of the model folders under FOLDER."""
    files = {}
    for model in sorted(os.listdir(folder)):
        path = os.path.join(folder, model)
        if model.startswith(".") or not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            with open(os.path.join(path, name), "rb") as f:
                files["%s/%s" % (model, name)] = f.read()
    return files


def configmap_bytes(configmap):
    contents = {k: v.encode("utf-8") for k, v in (configmap.get("data") or {}).items()}
    for k, v in (configmap.get("binaryData") or {}).items():
        contents[k] = base64.b64decode("".join(v.split()), validate=True)
    return contents


def kubelet_layout(folder, items, contents):
    """Writes a ConfigMap volume as the kubelet's atomic writer does."""
    stamp = "..2025_01_01_00_00_00.000000000"
    for item in items:
        path = os.path.join(folder, stamp, item["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(contents[item["key"]])
    os.symlink(stamp, os.path.join(folder, "..data"))
    for top in sorted({item["path"].split("/")[0] for item in items}):
        os.symlink(os.path.join("..data", top), os.path.join(folder, top))


def kubectl_render(kubectl, folder, components):
    """`kubectl kustomize` of FOLDER with COMPONENTS over it, through a
    kustomization in a temporary folder (kustomize wants relative paths)."""
    with tempfile.TemporaryDirectory() as parent:
        rel = lambda p: os.path.relpath(os.path.abspath(p), parent)  # noqa: E731
        with open(os.path.join(parent, "kustomization.yaml"), "w") as f:
            yaml.safe_dump({"resources": [rel(folder)],
                            "components": [rel(c) for c in components]}, f)
        out = subprocess.run([kubectl, "kustomize", parent], capture_output=True,
                             text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_key(resources):
    return {(r["apiVersion"], r["kind"], r["metadata"]["name"]): r for r in resources}


def validate_schemas(c, label, resources, cache):
    versions = sorted({v for v in all_versions() if Version(v) >= Version(MIN_KUBERNETES)},
                      key=Version)
    c.check("kubernetes-validate bundles Kubernetes %s or newer" % MIN_KUBERNETES,
            bool(versions), "it bundles %s" % all_versions())
    for r in resources:
        name = "%s schema: %s/%s valid (strict) in Kubernetes %s..%s" % (
            label, r["kind"], r["metadata"]["name"], versions[0], versions[-1])
        key = json.dumps(r, sort_keys=True)
        if key not in cache:
            problems = []
            for version in versions:
                try:
                    kubernetes_validate.validate(r, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    problems.append("%s: %s: %s" % (
                        version, ".".join(str(p) for p in e.path), e.message))
                except (kubernetes_validate.SchemaNotFoundError,
                        kubernetes_validate.InvalidSchemaError) as e:
                    problems.append("%s: %s" % (version, e.message))
            cache[key] = problems
        c.check(name, not cache[key], "; ".join(cache[key][:3]))


def check_render(c, label, resources, docker, server_flags, health_names, models,
                 http_readiness=False):
    """Invariants every rendering must keep; HTTP_READINESS for a rendering
    with components/http-readiness (the server's readinessProbe an HTTP GET
    through the front door instead of a gRPC probe). Returns the Deployment
    and the generated ConfigMap (or None, None when missing)."""
    p = label + " "
    kinds = sorted(r["kind"] for r in resources)
    deployment, service = one(resources, "Deployment"), one(resources, "Service")
    hpa, pdb = one(resources, "HorizontalPodAutoscaler"), one(resources, "PodDisruptionBudget")
    configmap = one(resources, "ConfigMap")
    if not c.check(p + "renders one Deployment, Service, HorizontalPodAutoscaler, "
                   "PodDisruptionBudget and ConfigMap",
                   all((deployment, service, hpa, pdb, configmap)), "got %s" % kinds):
        return None, None
    c.check(p + "HorizontalPodAutoscaler is autoscaling/v2, PodDisruptionBudget policy/v1",
            hpa["apiVersion"] == "autoscaling/v2" and pdb["apiVersion"] == "policy/v1",
            "%s, %s" % (hpa["apiVersion"], pdb["apiVersion"]))

    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"].get("labels", {})
    containers = pod["containers"]
    all_containers = containers + (pod.get("initContainers") or [])
    server = next((x for x in containers if x["name"] == "attnserve"), None)
    if not c.check(p + "the Deployment has a container named attnserve", server):
        return deployment, configmap

    # --- Selectors. ---
    c.check(p + "Deployment selector matches its pod labels",
            subset(spec["selector"].get("matchLabels"), pod_labels))
    c.check(p + "Service selector matches the pod labels",
            subset(service["spec"].get("selector"), pod_labels),
            "%s vs %s" % (service["spec"].get("selector"), pod_labels))
    c.check(p + "PodDisruptionBudget selector matches the pod labels",
            subset(pdb["spec"]["selector"].get("matchLabels"), pod_labels),
            "%s vs %s" % (pdb["spec"]["selector"], pod_labels))
    for t in pod.get("topologySpreadConstraints") or []:
        c.check(p + "topologySpreadConstraints selector matches the pod labels",
                subset(t["labelSelector"].get("matchLabels"), pod_labels))

    # --- HPA and PDB. ---
    ref = hpa["spec"]["scaleTargetRef"]
    c.check(p + "HorizontalPodAutoscaler targets the Deployment by name",
            ref == {"apiVersion": "apps/v1", "kind": "Deployment",
                    "name": deployment["metadata"]["name"]}, str(ref))
    cpu_metrics = [m for m in hpa["spec"].get("metrics", [])
                   if m["type"] == "Resource" and m["resource"]["name"] == "cpu"
                   and m["resource"]["target"]["type"] == "Utilization"]
    c.check(p + "HorizontalPodAutoscaler scales on CPU utilisation", cpu_metrics)
    low, high = hpa["spec"].get("minReplicas", 1), hpa["spec"]["maxReplicas"]
    c.check(p + "HorizontalPodAutoscaler 2 <= minReplicas <= maxReplicas",
            2 <= low <= high, "min %s, max %s" % (low, high))
    c.check(p + "CPU utilisation has a CPU request to refer to",
            all("cpu" in x.get("resources", {}).get("requests", {}) for x in containers))
    c.check(p + "Deployment leaves replicas to the HorizontalPodAutoscaler",
            "replicas" not in spec, "replicas: %s" % spec.get("replicas"))
    unavailable = pdb["spec"].get("maxUnavailable")
    available = pdb["spec"].get("minAvailable")
    c.check(p + "PodDisruptionBudget leaves a pod at minReplicas",
            (isinstance(unavailable, int) and 0 < unavailable < low) or
            (isinstance(available, int) and 0 < available < low),
            "maxUnavailable %s, minAvailable %s, minReplicas %s" % (unavailable, available, low))

    # --- Command and args against the server and the image. ---
    command = server.get("command") or []
    c.check(p + "command is the image's attnserve binary",
            command[:1] == (docker["entrypoint"] or [])[:1],
            "%s vs ENTRYPOINT %s" % (command, docker["entrypoint"]))
    args = server.get("args") or []
    names = [re.match(r"^--([A-Za-z0-9_]+)", a).group(1) if a.startswith("--") else None
             for a in args]
    c.check(p + "every arg is a --flag=value of server/flags.cc",
            all(n in server_flags and "=" in a for n, a in zip(names, args)),
            "unknown or malformed: %s" % [a for n, a in zip(names, args)
                                          if n not in server_flags or "=" not in a])
    c.check(p + "no flag is given twice", len(names) == len(set(names)), str(names))
    env = env_values(server)
    defined = set()
    unresolved = []
    for var in server.get("env") or []:
        unresolved += [n for n in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                             var.get("value", "")) if n not in defined]
        defined.add(var["name"])
    for a in command + args:
        unresolved += [n for n in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a)
                       if n not in defined]
    c.check(p + "every $(VAR) in args and env names an env var defined before it",
            not unresolved, "undefined: %s" % unresolved)
    flags = server_view(server_flags, [expand(a, env) for a in args])
    c.check(p + "gRPC connections age out (--grpc_max_connection_age_ms > 0), so "
            "existing clients reach pods the HorizontalPodAutoscaler adds",
            int(flags.get("grpc_max_connection_age_ms") or 0) > 0,
            "--grpc_max_connection_age_ms=%s" % flags.get("grpc_max_connection_age_ms"))

    # --- Resources. ---
    limits = server.get("resources", {}).get("limits", {})
    requests = server.get("resources", {}).get("requests", {})
    cpu = quantity(limits.get("cpu", "0"))
    c.check(p + "CPU limit is a whole number of cores", cpu >= 1 and cpu == int(cpu),
            "limits.cpu %s" % limits.get("cpu"))
    # 0 (the default): one worker per CPU of the cgroup quota, rounded up.
    workers = int(flags.get("worker_threads") or 0) or int(-(-cpu // 1))
    c.check(p + "worker threads (--worker_threads, else the CPU quota) match the "
            "CPU limit", workers == cpu,
            "%s workers, limits.cpu %s" % (workers, limits.get("cpu")))
    message_bytes = int(flags.get("max_message_bytes") or 0)
    memory = quantity(limits.get("memory", "0"))
    need = (workers + 1) * PEAK_MEMORY_PER_MESSAGE * message_bytes
    c.check(p + "memory limit holds a maximum message per worker plus one being "
            "received (%.1fx message size each)" % PEAK_MEMORY_PER_MESSAGE,
            message_bytes > 0 and memory >= need,
            "limits.memory %s < %.0f MiB for --max_message_bytes=%s"
            % (limits.get("memory"), need / 2**20, message_bytes))
    c.check(p + "memory request equals its limit (not overcommitted)",
            quantity(requests.get("memory", "0")) == memory)

    # --- Ports: the front door (nginx) owns the pod's grpc and http ports;
    # the server listens on loopback behind it. ---
    ports = {}
    for x in containers:
        for port in x.get("ports", []):
            ports[port["name"]] = port["containerPort"]
    server_ports = {x["name"]: x["containerPort"] for x in server.get("ports", [])}
    grpc_port, metrics_port = flags.get("grpc_port"), flags.get("metrics_port")
    http_port = flags.get("http_port")
    door = next((x for x in containers if x["name"] == "front-door"), None)
    door_conf = parse_front_door(os.path.join(REPO, "deploy", "nginx", "front-door.conf"))
    grpc_door, rest_door = door_conf["grpc"] or {}, door_conf["rest"] or {}
    c.check(p + "a front-door container runs nginx on the image's front-door.conf",
            door is not None and (door.get("command") or [])[:3] ==
            ["/usr/sbin/nginx", "-c", "/etc/attnserve/front-door.conf"],
            str((door or {}).get("command")))
    c.check(p + "the image carries deploy/nginx/front-door.conf where the front door reads it",
            docker["front_door_conf"] == "/etc/attnserve/front-door.conf",
            "Dockerfile COPY: %s" % docker["front_door_conf"])
    c.check(p + "the server's gRPC listens on loopback only (--host=127.0.0.1)",
            flags.get("host") == "127.0.0.1", "--host=%s" % flags.get("host"))
    c.check(p + "the front door forwards to the server's --grpc_port on loopback",
            grpc_port is not None and grpc_door.get("target") == "127.0.0.1:%s" % grpc_port,
            "grpc upstream %s, --grpc_port=%s" % (grpc_door.get("target"), grpc_port))
    door_ports = {x["name"]: x["containerPort"] for x in (door or {}).get("ports", [])}
    c.check(p + "the front door listens (HTTP/2) on its container port named grpc",
            door_ports.get("grpc") in grpc_door.get("listen", ()) and
            grpc_door.get("http2") and "grpc" not in server_ports,
            "gRPC listen %s, front-door ports %s, server ports %s"
            % (grpc_door.get("listen"), door_ports, server_ports))
    # KServe v2 over HTTP/REST, the same way.
    http_host = flags.get("http_host") or flags.get("host")
    c.check(p + "the server's HTTP port is on and on loopback only (--http_port > 0; "
            "--http_host, else --host, is 127.0.0.1)",
            int(http_port or 0) > 0 and http_host == "127.0.0.1",
            "--http_port=%s, HTTP host %s" % (http_port, http_host))
    c.check(p + "the front door forwards HTTP to the server's --http_port on loopback",
            http_port is not None and rest_door.get("target") == "127.0.0.1:%s" % http_port,
            "HTTP upstream %s, --http_port=%s" % (rest_door.get("target"), http_port))
    c.check(p + "the front door listens (HTTP/1.1, not http2) on its container port named http",
            door_ports.get("http") in rest_door.get("listen", ()) and
            rest_door.get("http2") is False and "http" not in server_ports,
            "HTTP listen %s, front-door ports %s, server ports %s"
            % (rest_door.get("listen"), door_ports, server_ports))
    own = [int(x) for x in (grpc_port, http_port, metrics_port) if x is not None]
    c.check(p + "the server's gRPC, HTTP and metrics ports are distinct and none is one "
            "the front door listens on (they share the pod's network namespace)",
            len(own) == 3 and len(set(own)) == 3 and not set(own) & door_conf["listen"],
            "server %s, front door %s" % (own, sorted(door_conf["listen"])))
    levels = (door_conf["http"], rest_door.get("server"), rest_door.get("location"))
    upstream = rest_door.get("upstream") or []
    headers = [args for n, args, _ in rest_door.get("location") or []
               if n == "proxy_set_header"]
    c.check(p + "the front door keeps HTTP upstream connections alive (keepalive, "
            "proxy_http_version 1.1, Connection \"\")",
            int((nginx_args(upstream, "keepalive") or ["0"])[0]) > 0 and
            nginx_effective("proxy_http_version", *levels) == ["1.1"] and
            ["Connection", ""] in headers,
            "keepalive %s, proxy_http_version %s, proxy_set_header %s" % (
                nginx_args(upstream, "keepalive"),
                nginx_effective("proxy_http_version", *levels), headers))
    # nginx's default upstream keepalive_timeout is 60 s.
    idle_s = nginx_seconds((nginx_args(upstream, "keepalive_timeout") or ["60s"])[0])
    request_timeout_s = int(flags.get("http_request_timeout_ms") or 0) / 1000.0
    c.check(p + "the front door drops idle HTTP upstream connections before attnserve does "
            "(upstream keepalive_timeout < --http_request_timeout_ms)",
            idle_s is not None and idle_s < request_timeout_s,
            "keepalive_timeout %s s, --http_request_timeout_ms=%s"
            % (idle_s, flags.get("http_request_timeout_ms")))
    c.check(p + "the front door reads HTTP request bodies whole before forwarding "
            "(proxy_request_buffering on)",
            nginx_effective("proxy_request_buffering", *levels) in (None, ["on"]),
            str(nginx_effective("proxy_request_buffering", *levels)))
    body_bytes = nginx_bytes((nginx_effective("client_max_body_size", *levels) or ["1m"])[0])
    c.check(p + "the front door's HTTP client_max_body_size is --max_message_bytes",
            body_bytes == message_bytes,
            "client_max_body_size %s bytes, --max_message_bytes=%s" % (body_bytes, message_bytes))
    for what in ("connect", "read", "send"):
        grpc_t = nginx_effective("grpc_%s_timeout" % what, door_conf["http"],
                                 grpc_door.get("server"), grpc_door.get("location"))
        rest_t = nginx_effective("proxy_%s_timeout" % what, *levels)
        c.check(p + "the front door's HTTP %s timeout is the gRPC location's" % what,
                grpc_t is not None and rest_t == grpc_t,
                "proxy_%s_timeout %s, grpc_%s_timeout %s" % (what, rest_t, what, grpc_t))
    c.check(p + "the front door spools no HTTP response to disk (proxy_max_temp_file_size 0)",
            nginx_effective("proxy_max_temp_file_size", *levels) == ["0"],
            str(nginx_effective("proxy_max_temp_file_size", *levels)))
    # Request bodies wait in client_body_temp_path: a memory-backed volume
    # whose tmpfs size answers a body that does not fit with 500 (no
    # eviction), holding at least one body of the largest size, and charged
    # to the front door's memory limit.
    body_path = (nginx_args(door_conf["http"], "client_body_temp_path") or [""])[0]
    door_memory = memory_volumes(pod, door or {})
    under = [m for m in door_memory if body_path == m or body_path.startswith(m.rstrip("/") + "/")]
    body_mount = max(under, key=len) if under else None
    body_size = door_memory.get(body_mount)
    c.check(p + "the front door's client_body_temp_path is on a memory-backed volume "
            "with a sizeLimit of at least client_max_body_size",
            body_mount is not None and body_size is not None and body_bytes is not None and
            body_size >= body_bytes,
            "client_body_temp_path %s, memory-backed mounts %s, client_max_body_size %s"
            % (body_path, door_memory, body_bytes))
    door_limit = quantity(((door or {}).get("resources", {}).get("limits") or {})
                          .get("memory", "0"))
    volumes_bytes = sum(v or float("inf") for v in door_memory.values())
    c.check(p + "the front door's memory limit holds nginx (%d MiB) and its memory-backed "
            "volumes" % (NGINX_MEMORY_BYTES >> 20),
            door_limit >= NGINX_MEMORY_BYTES + volumes_bytes,
            "limits.memory %.0f MiB < %d MiB + %s" % (
                door_limit / 2**20, NGINX_MEMORY_BYTES >> 20,
                {k: (v or 0) / 2**20 for k, v in door_memory.items()}))
    c.check(p + "--metrics_port is the server's container port named metrics, on every "
            "address (--metrics_host=0.0.0.0)",
            metrics_port is not None and server_ports.get("metrics") == int(metrics_port) and
            flags.get("metrics_host") == "0.0.0.0",
            "--metrics_port=%s --metrics_host=%s, ports %s"
            % (metrics_port, flags.get("metrics_host"), server_ports))
    c.check(p + "the image EXPOSEs the container ports",
            set(ports.values()) <= docker["expose"],
            "%s vs EXPOSE %s" % (sorted(ports.values()), sorted(docker["expose"])))
    service_ports = {sp["name"]: sp for sp in service["spec"]["ports"]}
    for name in ("grpc", "http", "metrics"):
        sp = service_ports.get(name)
        target = sp and sp.get("targetPort", sp.get("port"))
        target = ports.get(target) if isinstance(target, str) else target
        c.check(p + "Service port %s targets the container port %s" % (name, name),
                sp is not None and target == ports.get(name),
                "Service ports %s" % service["spec"]["ports"])
    c.check(p + "Service port grpc has appProtocol grpc",
            service_ports.get("grpc", {}).get("appProtocol") == "grpc")
    c.check(p + "Service port http is 8000 (the KServe/Triton HTTP port) with appProtocol http",
            service_ports.get("http", {}).get("port") == 8000 and
            service_ports.get("http", {}).get("appProtocol") == "http",
            str(service_ports.get("http")))
    annotations = spec["template"]["metadata"].get("annotations", {})
    c.check(p + "prometheus.io/port is the metrics port",
            annotations.get("prometheus.io/port") == str(ports.get("metrics")) and
            annotations.get("prometheus.io/scrape") == "true",
            str(annotations))

    # --- Probes and the drain arithmetic. ---
    probes = {k: server.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    grpc_probes = ("startupProbe",) if http_readiness else ("startupProbe", "readinessProbe")
    for kind in grpc_probes:
        probe = probes[kind]
        grpc = (probe or {}).get("grpc")
        c.check(p + "%s is a gRPC probe on the pod's grpc port (through the front door)" % kind,
                grpc is not None and grpc.get("port") == ports.get("grpc"),
                str(probe))
        c.check(p + "%s asks about a service the server reports" % kind,
                grpc is not None and grpc.get("service", "") in health_names,
                "%r not in %s" % ((grpc or {}).get("service"), sorted(health_names)))
    if http_readiness:
        # components/http-readiness: KServe's readiness through the door.
        ready = probes["readinessProbe"] or {}
        get = ready.get("httpGet") or {}
        resolved = probe_port(server, get.get("port"))
        c.check(p + "readinessProbe is an HTTP GET of %s (and nothing else)" % HTTP_READY_PATH,
                set(ready) & {"httpGet", "grpc", "exec", "tcpSocket"} == {"httpGet"} and
                get.get("path") == HTTP_READY_PATH and
                get.get("scheme", "HTTP") == "HTTP" and not get.get("host"),
                str(ready))
        c.check(p + "readinessProbe's port, resolved as the kubelet does (a name only among "
                "the attnserve container's own ports), is the front door's http port",
                resolved is not None and resolved == door_ports.get("http") and
                resolved in rest_door.get("listen", ()),
                "port %r resolves to %s; front door http %s, listening %s" % (
                    get.get("port"), resolved, door_ports.get("http"),
                    rest_door.get("listen")))
    live = (probes["livenessProbe"] or {}).get("exec", {}).get("command") or []
    c.check(p + "livenessProbe asks the server itself on loopback (attnctl health "
            "--target=127.0.0.1:--grpc_port)",
            live[:2] == ["/usr/local/bin/attnctl", "health"] and
            "--target=127.0.0.1:%s" % grpc_port in live, str(live))
    for kind in ("readinessProbe", "livenessProbe"):
        get = ((door or {}).get(kind) or {}).get("httpGet") or {}
        c.check(p + "the front door's %s is its /healthz" % kind,
                get.get("path") == "/healthz" and get.get("port") in door_conf["listen"],
                str(get))
    drain_ms = int(flags.get("drain_notice_ms") or 0)
    grace_ms = int(flags.get("grace_period_ms") or 0)
    ready = probes["readinessProbe"] or {}
    detect_s = (ready.get("periodSeconds", 10) * ready.get("failureThreshold", 3) +
                ready.get("timeoutSeconds", 1))
    c.check(p + "readiness sees NOT_SERVING (period x failureThreshold + timeout) "
            "with %.0f s of the drain notice left for endpoint propagation"
            % ENDPOINT_PROPAGATION_S,
            detect_s + ENDPOINT_PROPAGATION_S <= drain_ms / 1000.0,
            "%s s + %s s > --drain_notice_ms=%s" % (detect_s, ENDPOINT_PROPAGATION_S, drain_ms))
    pre_stop = (((door or {}).get("lifecycle") or {}).get("preStop") or {}).get("exec", {})
    pre_stop = pre_stop.get("command") or []
    waits = float(pre_stop[1]) if pre_stop[:1] == ["/bin/sleep"] and len(pre_stop) == 2 else 0
    c.check(p + "the front door outlives the server's drain (preStop sleep >= drain "
            "notice + grace period)", waits >= (drain_ms + grace_ms) / 1000.0,
            "preStop %s, drain %s ms + grace %s ms" % (pre_stop, drain_ms, grace_ms))
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    longest = (drain_ms + grace_ms) / 1000.0 + SERVER_EXIT_SLACK_S
    c.check(p + "terminationGracePeriodSeconds >= drain notice + grace period + "
            "%.1f s server slack + %.0f s margin" % (SERVER_EXIT_SLACK_S, TERMINATION_MARGIN_S),
            tgps >= longest + TERMINATION_MARGIN_S,
            "%s s < %.1f s + %.0f s" % (tgps, longest, TERMINATION_MARGIN_S))
    startup = probes["startupProbe"] or {}
    c.check(p + "startupProbe allows >= 30 s for start-up and warm-up",
            startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) >= 30)

    # --- Security. ---
    pod_sc = pod.get("securityContext", {})
    user, _, group = (docker["user"] or "").partition(":")
    c.check(p + "the image's USER is numeric (runAsNonRoot needs it) and its useradd uid",
            user.isdigit() and int(user) == docker["useradd_uid"],
            "USER %s, useradd --uid %s" % (docker["user"], docker["useradd_uid"]))
    for key in ("runAsUser", "runAsGroup"):
        want = {"runAsUser": user, "runAsGroup": group}[key]
        c.check(p + "pod securityContext %s, if set, is the image's" % key,
                key not in pod_sc or (want.isdigit() and pod_sc[key] == int(want)),
                "%s %s, image USER %s" % (key, pod_sc.get(key), docker["user"]))
    c.check(p + "automountServiceAccountToken is false",
            pod.get("automountServiceAccountToken") is False)
    for x in all_containers:
        sc = dict(pod_sc)
        sc.update(x.get("securityContext", {}))
        who = "%scontainer %s" % (p, x["name"])
        for key, want in SECURITY.items():
            c.check(who + " %s is %s" % (key, want), sc.get(key) is want,
                    "effective %s" % sc.get(key))
        c.check(who + " runAsUser is the image's USER",
                user.isdigit() and sc.get("runAsUser") == int(user),
                "runAsUser %s, image USER %s" % (sc.get("runAsUser"), docker["user"]))
        if group:
            c.check(who + " runAsGroup is the image's group",
                    sc.get("runAsGroup") == int(group),
                    "runAsGroup %s, image %s" % (sc.get("runAsGroup"), group))
        c.check(who + " is not privileged", not sc.get("privileged"))
        caps = sc.get("capabilities", {})
        c.check(who + " drops ALL capabilities and adds none",
                "ALL" in (caps.get("drop") or []) and not caps.get("add"), str(caps))
        c.check(who + " seccompProfile is RuntimeDefault",
                (sc.get("seccompProfile") or {}).get("type") == "RuntimeDefault")
        c.check(who + " has CPU and memory requests and limits",
                all(k in x.get("resources", {}).get(w, {})
                    for w in ("requests", "limits") for k in ("cpu", "memory")))
        c.check(who + " image is the server's image",
                x["image"] == server["image"], "%s vs %s" % (x["image"], server["image"]))

    # --- The model repository. ---
    c.check(p + "--model_repository is " + MODEL_REPOSITORY_MOUNT,
            flags.get("model_repository") == MODEL_REPOSITORY_MOUNT,
            str(flags.get("model_repository")))
    mounts = {m["mountPath"]: m for m in server.get("volumeMounts", [])}
    mount = mounts.get(flags.get("model_repository"))
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    c.check(p + "a volume is mounted at --model_repository",
            mount is not None and mount["name"] in volumes, str(mounts))
    configmap_volumes = [v for v in volumes.values() if "configMap" in v]
    c.check(p + "exactly one volume is the models ConfigMap, by its generated name",
            len(configmap_volumes) == 1 and
            configmap_volumes[0]["configMap"]["name"] == configmap["metadata"]["name"],
            "%s vs %s" % ([v["configMap"]["name"] for v in configmap_volumes],
                          configmap["metadata"]["name"]))
    contents = configmap_bytes(configmap)
    items = configmap_volumes[0]["configMap"].get("items", []) if configmap_volumes else []
    item_paths = {i["key"]: i["path"] for i in items}
    size = sum(len(k) + len(v) for k, v in contents.items())
    c.check(p + "ConfigMap is under its 1 MiB limit", size < CONFIGMAP_LIMIT_BYTES,
            "%d bytes" % size)
    for path, data in sorted(models.items()):
        key = path.replace("/", ".")
        c.check(p + "deploy/models/%s is in the ConfigMap as %s, byte for byte" % (path, key),
                contents.get(key) == data,
                "missing" if key not in contents else "content differs")
        c.check(p + "volume items map %s back to %s" % (key, path),
                item_paths.get(key) == path, "items: %s" % item_paths.get(key))
    c.check(p + "volume items and ConfigMap keys are the same set",
            set(item_paths) == set(contents),
            "only in items: %s; only in the ConfigMap: %s" % (
                sorted(set(item_paths) - set(contents)),
                sorted(set(contents) - set(item_paths))))
    c.check(p + "ConfigMap is immutable (read once at start-up)",
            configmap.get("immutable") is True)
    return deployment, configmap


def checked_render(c, label, *args):
    """check_render, with a crash (a field it expects is missing) reported
    as a failed check rather than a traceback alone."""
    try:
        return check_render(c, label, *args)
    except Exception as e:  # noqa: BLE001 - reported, then counted
        traceback.print_exc()
        c.check("%s: the invariant checks ran to the end" % label, False,
                "%s: %s (a field they read is missing?)" % (type(e).__name__, e))
        return None, None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("repo")
    parser.add_argument("workdir")
    parser.add_argument("--kubectl")
    a = parser.parse_args()
    k8s = os.path.join(a.repo, "deploy", "k8s")
    component = os.path.join(k8s, "components", "writable-repository")
    http_component = os.path.join(k8s, "components", "http-readiness")
    c = Checks()

    docker = parse_dockerfile(os.path.join(a.repo, "Dockerfile"))
    server_flags, health_names = parse_server_main(a.repo)
    models = model_files(os.path.join(a.repo, "deploy", "models"))
    c.check("deploy/models has model files", models)
    copies = model_files(os.path.join(k8s, "models"))
    for path in sorted(set(models) | set(copies)):
        c.check("deploy/k8s/models/%s is a current copy of deploy/models/%s" % (path, path),
                copies.get(path) == models.get(path),
                ("missing" if path not in copies else "extra" if path not in models
                 else "differs") + "; refresh with: cp -r deploy/models/*/ deploy/k8s/models/"
                " and update the configMapGenerator and volume items")

    renders = {}
    for label, components in (("base", []), ("writable", [component]),
                              ("http-readiness", [http_component])):
        try:
            renders[label], _ = kustomize_lite.render(k8s, components)
            c.check("%s renders (kustomize_lite)" % label, True)
        except kustomize_lite.RenderError as e:
            c.check("%s renders (kustomize_lite)" % label, False, str(e))
            continue
        if a.kubectl:
            try:
                theirs = by_key(kubectl_render(a.kubectl, k8s, components))
                ours = by_key(renders[label])
                differ = sorted("%s/%s" % (k[1], k[2]) for k in set(ours) | set(theirs)
                                if ours.get(k) != theirs.get(k))
                c.check("%s: kubectl kustomize renders the same objects" % label,
                        not differ, "differ: %s" % differ)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                c.check("%s: kubectl kustomize renders" % label, False, str(e))

    cache = {}
    for label, resources in renders.items():
        validate_schemas(c, label, resources, cache)

    base = renders.get("base")
    if base:
        deployment, configmap = checked_render(c, "base", base, docker, server_flags,
                                               health_names, models)
        if deployment:
            server = deployment["spec"]["template"]["spec"]["containers"][0]
            mount = next((m for m in server.get("volumeMounts", [])
                          if m["mountPath"] == MODEL_REPOSITORY_MOUNT), {})
            c.check("base: the repository mount is read-only (a ConfigMap)",
                    mount.get("readOnly") is True)
            # Files for the runtime check.
            out = os.path.join(a.workdir, "base")
            os.makedirs(out)
            env = env_values(server)
            args = [expand(x, env) for x in server["args"]]
            keep = [x for x in args
                    if re.match(r"^--([A-Za-z0-9_]+)", x) is None or
                    re.match(r"^--([A-Za-z0-9_]+)", x).group(1) not in RUNTIME_OWN_FLAGS]
            with open(os.path.join(out, "args"), "w") as f:
                f.write("".join(x + "\n" for x in keep))
            volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"]
                          if "configMap" in v)
            kubelet_layout(os.path.join(out, "repository"), volume["configMap"]["items"],
                           configmap_bytes(configmap))
            flags = server_view(server_flags, args)
            with open(os.path.join(out, "settings"), "w") as f:
                f.write("DRAIN_NOTICE_MS=%s\nGRACE_PERIOD_MS=%s\nTERMINATION_GRACE_S=%s\n" % (
                    int(flags["drain_notice_ms"]), int(flags["grace_period_ms"]),
                    int(deployment["spec"]["template"]["spec"]
                        .get("terminationGracePeriodSeconds", 30))))

    writable = renders.get("writable")
    if writable:
        deployment, configmap = checked_render(c, "writable", writable, docker,
                                               server_flags, health_names, models)
        if deployment:
            pod = deployment["spec"]["template"]["spec"]
            server = pod["containers"][0]
            volumes = {v["name"]: v for v in pod["volumes"]}
            mount = next((m for m in server.get("volumeMounts", [])
                          if m["mountPath"] == MODEL_REPOSITORY_MOUNT), {})
            repo_volume = volumes.get(mount.get("name"), {})
            claim = (repo_volume.get("persistentVolumeClaim") or {}).get("claimName")
            pvcs = {r["metadata"]["name"]: r for r in writable
                    if r["kind"] == "PersistentVolumeClaim"}
            c.check("writable: /models is the component's PersistentVolumeClaim",
                    claim in pvcs, "claim %s, PVCs %s" % (claim, sorted(pvcs)))
            c.check("writable: the claim is ReadWriteMany (every replica mounts it)",
                    "ReadWriteMany" in (pvcs.get(claim, {}).get("spec", {})
                                        .get("accessModes") or []))
            c.check("writable: /models is mounted writable", not mount.get("readOnly"))
            inits = pod.get("initContainers") or []
            seed = inits[0] if len(inits) == 1 else None
            if c.check("writable: one init container seeds the claim", seed):
                seed_mounts = {m["name"]: m["mountPath"] for m in seed["volumeMounts"]}
                seed_source = [n for n in seed_mounts if "configMap" in volumes.get(n, {})]
                c.check("writable: the seed reads the ConfigMap and writes the claim",
                        len(seed_source) == 1 and seed_mounts.get(mount.get("name")) ==
                        MODEL_REPOSITORY_MOUNT, str(seed_mounts))
                c.check("writable: the seed runs /bin/sh -c SCRIPT",
                        seed.get("command", [])[:2] == ["/bin/sh", "-c"] and
                        len(seed["command"]) == 3)
                if seed_source and len(seed.get("command", [])) == 3:
                    out = os.path.join(a.workdir, "writable")
                    os.makedirs(out)
                    script = seed["command"][2]
                    script = script.replace(seed_mounts[seed_source[0]], "${SEED_DIR}")
                    script = script.replace(MODEL_REPOSITORY_MOUNT, "${MODELS_DIR}")
                    with open(os.path.join(out, "seed.sh"), "w") as f:
                        f.write(script)
                    kubelet_layout(os.path.join(out, "seed"),
                                   volumes[seed_source[0]]["configMap"]["items"],
                                   configmap_bytes(configmap))

    http_render = renders.get("http-readiness")
    if http_render:
        deployment, _ = checked_render(c, "http-readiness", http_render, docker,
                                       server_flags, health_names, models, True)
        base_deployment = one(base or [], "Deployment")
        if deployment and base_deployment:
            def server_of(d):
                return next((x for x in d["spec"]["template"]["spec"]["containers"]
                             if x["name"] == "attnserve"), {})

            def timing(probe):
                probe = probe or {}
                return {k: probe.get(k, default) for k, default in (
                    ("initialDelaySeconds", 0), ("periodSeconds", 10), ("timeoutSeconds", 1),
                    ("failureThreshold", 3), ("successThreshold", 1))}
            ours, theirs = server_of(deployment), server_of(base_deployment)
            c.check("http-readiness: readinessProbe has the base's timing (the drain "
                    "arithmetic holds unchanged)",
                    timing(ours.get("readinessProbe")) == timing(theirs.get("readinessProbe")),
                    "%s vs base %s" % (timing(ours.get("readinessProbe")),
                                       timing(theirs.get("readinessProbe"))))
            rest = {k: v for k, v in ours.items() if k != "readinessProbe"}
            c.check("http-readiness: the component changes the server's readinessProbe and "
                    "nothing else",
                    rest == {k: v for k, v in theirs.items() if k != "readinessProbe"} and
                    by_key([r for r in http_render if r["kind"] != "Deployment"]) ==
                    by_key([r for r in base if r["kind"] != "Deployment"]) and
                    [x for x in deployment["spec"]["template"]["spec"]["containers"]
                     if x["name"] != "attnserve"] ==
                    [x for x in base_deployment["spec"]["template"]["spec"]["containers"]
                     if x["name"] != "attnserve"])
            # For the runtime check: the path the probe asks, through the door.
            out = os.path.join(a.workdir, "http-readiness")
            os.makedirs(out)
            with open(os.path.join(out, "settings"), "w") as f:
                f.write("READY_PATH=%s\n" % ours["readinessProbe"]["httpGet"]["path"])

    print("%d passed, %d failed" % (c.passed, c.failed))
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())

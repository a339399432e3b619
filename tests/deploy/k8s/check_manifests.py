#!/usr/bin/env python3
"""Checks deploy/k8s: renders it, validates every object against the
Kubernetes schemas, and checks the invariants the manifests' comments
promise. Run by k8s_test.sh (in its venv: kubernetes-validate, PyYAML).

    check_manifests.py REPO WORKDIR [--kubectl KUBECTL]

Renders deploy/k8s twice with kustomize_lite.py (beside this file): as
shipped ("base") and with components/writable-repository ("writable").
With --kubectl, `kubectl kustomize` renders both too and must give the same
objects. Every object must validate, strictly (unknown fields are errors),
against every Kubernetes minor from MIN_KUBERNETES to the newest one
kubernetes-validate bundles. Each invariant is one named check; a failure
prints "FAIL <invariant>: <what is wrong>". The last line is
"N passed, M failed"; exit 1 when any check failed.

For the runtime checks of k8s_test.sh it also writes into WORKDIR:
  base/args             the server's args, one per line, $(VAR)s expanded as
                        the kubelet would, without --host, --grpc_port,
                        --metrics_port and --model_repository
  base/repository/      the ConfigMap volume as the kubelet lays it out
                        (..data symlink, timestamped folder, items' paths)
  base/settings         shell assignments: DRAIN_NOTICE_MS, GRACE_PERIOD_MS,
                        TERMINATION_GRACE_S
  writable/seed.sh      the init container's script, its mount paths made
                        ${SEED_DIR} and ${MODELS_DIR}
  writable/seed/        the seed volume, laid out as base/repository
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
RUNTIME_OWN_FLAGS = ("host", "grpc_port", "metrics_port", "model_repository")

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


def parse_front_door(path):
    """deploy/nginx/front-door.conf's listen ports and its upstream server."""
    with open(path) as f:
        text = re.sub(r"#.*", "", f.read())
    listen = {int(m) for m in re.findall(r"\blisten\s+(?:[\d.]+:)?(\d+)", text)}
    upstream = re.search(r"upstream\s+\w+\s*\{[^}]*\bserver\s+([^;\s]+)", text)
    return {"listen": listen, "upstream": upstream.group(1) if upstream else None}


def integer_literal(text):
    """The value of a C++ integer default such as 1000, 256 << 20 or
    int64_t{1} << 26; None for anything else."""
    text = re.sub(r"\b\w+\{(\d+)\}", r"\1", text.strip())
    m = re.match(r"^(\d+)(?:\s*<<\s*(\d+))?$", text)
    return None if not m else int(m.group(1)) << int(m.group(2) or 0)


def parse_server_main(repo):
    """The server's flags {name: integer default or None} (server/flags.cc)
    and the service names its health service reports ("" included;
    server/api/grpc_server.cc)."""
    with open(os.path.join(repo, "server", "flags.cc")) as f:
        text = f.read()
    flags = {name: integer_literal(default) for name, default in re.findall(
        r"ABSL_FLAG\(\s*[^,]+?\s*,\s*(\w+)\s*,\s*([^,]+?)\s*,", text)}
    with open(os.path.join(repo, "server", "api", "grpc_server.cc")) as f:
        text = f.read()
    health = {""} | set(re.findall(r'SetServingStatus\(\s*"([^"]+)"', text))
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


def check_render(c, label, resources, docker, server_flags, health_names, models):
    """Invariants every rendering must keep. Returns the Deployment and the
    generated ConfigMap (or None, None when missing)."""
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

    # --- Ports: the front door (nginx) owns the pod's grpc port; the server
    # listens on loopback behind it. ---
    ports = {}
    for x in containers:
        for port in x.get("ports", []):
            ports[port["name"]] = port["containerPort"]
    server_ports = {x["name"]: x["containerPort"] for x in server.get("ports", [])}
    grpc_port, metrics_port = flags.get("grpc_port"), flags.get("metrics_port")
    door = next((x for x in containers if x["name"] == "front-door"), None)
    door_conf = parse_front_door(os.path.join(REPO, "deploy", "nginx", "front-door.conf"))
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
            grpc_port is not None and door_conf["upstream"] == "127.0.0.1:%s" % grpc_port,
            "upstream %s, --grpc_port=%s" % (door_conf["upstream"], grpc_port))
    door_ports = {x["name"]: x["containerPort"] for x in (door or {}).get("ports", [])}
    c.check(p + "the front door listens on its container port named grpc",
            door_ports.get("grpc") in door_conf["listen"] and "grpc" not in server_ports,
            "listen %s, front-door ports %s, server ports %s"
            % (door_conf["listen"], door_ports, server_ports))
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
    for name in ("grpc", "metrics"):
        sp = service_ports.get(name)
        target = sp and sp.get("targetPort", sp.get("port"))
        target = ports.get(target) if isinstance(target, str) else target
        c.check(p + "Service port %s targets the container port %s" % (name, name),
                sp is not None and target == ports.get(name),
                "Service ports %s" % service["spec"]["ports"])
    c.check(p + "Service port grpc has appProtocol grpc",
            service_ports.get("grpc", {}).get("appProtocol") == "grpc")
    annotations = spec["template"]["metadata"].get("annotations", {})
    c.check(p + "prometheus.io/port is the metrics port",
            annotations.get("prometheus.io/port") == str(ports.get("metrics")) and
            annotations.get("prometheus.io/scrape") == "true",
            str(annotations))

    # --- Probes and the drain arithmetic. ---
    probes = {k: server.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    for kind in ("startupProbe", "readinessProbe"):
        probe = probes[kind]
        grpc = (probe or {}).get("grpc")
        c.check(p + "%s is a gRPC probe on the pod's grpc port (through the front door)" % kind,
                grpc is not None and grpc.get("port") == ports.get("grpc"),
                str(probe))
        c.check(p + "%s asks about a service the server reports" % kind,
                grpc is not None and grpc.get("service", "") in health_names,
                "%r not in %s" % ((grpc or {}).get("service"), sorted(health_names)))
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
    for label, components in (("base", []), ("writable", [component])):
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

    print("%d passed, %d failed" % (c.passed, c.failed))
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Static checks of the monitoring files that no tool here checks for us.

  python files_check.py REPO PODMAN_COMPOSE_UP_LOG

REPO: the repository root. PODMAN_COMPOSE_UP_LOG: the output of
`podman-compose --verbose --dry-run -f deploy/compose.yaml up --no-build -d`
(the podman commands a Compose implementation derives from the file).

Grafana is not packaged for Debian, so the dashboard is checked against the
structure Grafana needs (schemaVersion, panels with a gridPos on the 24-column
grid that do not overlap, targets with expr and unique refIds, the datasource
variable, every $variable defined); monitoring_test.sh then runs every
expression against a real Prometheus. The compose file has already passed the
Compose Specification's JSON schema; here its meaning is checked: the build
context holds the Dockerfile, every bind-mounted path exists, the wiring
between attnserve, Prometheus and Grafana agrees with the files mounted.
Prints each failed check and a count; exit 1 if any failed.
"""

import json
import os
import re
import sys

import yaml

FAILURES = []
CHECKS = [0]


def check(ok, what):
    """Counts a check; prints it only when it failed (there are hundreds)."""
    CHECKS[0] += 1
    if not ok:
        print("FAIL " + what)
        FAILURES.append(what)
    return ok


# Grafana's own variables; $__rate_interval and friends are filled in by
# Grafana at query time.
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range",
                    "__range_s", "__range_ms", "__from", "__to", "__dashboard"}
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "text",
               "heatmap", "piechart", "state-timeline"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def variables_in(text):
    return {a or b or c for a, b, c in VARIABLE.findall(text)}


def check_dashboard(path):
    with open(path, encoding="utf-8") as f:
        try:
            dash = json.load(f)
        except json.JSONDecodeError as e:
            check(False, f"dashboard: {path} is not JSON: {e}")
            return
    check(True, f"dashboard: {os.path.basename(path)} is JSON")
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int),
                      ("panels", list), ("templating", dict), ("time", dict)):
        check(isinstance(dash.get(key), kind), f"dashboard: has {key} ({kind.__name__})")
    # Grafana 10-11 write 36-39; below 36 panels still carry old datasource
    # strings and Grafana would migrate the file on every load.
    check(isinstance(dash.get("schemaVersion"), int) and dash["schemaVersion"] >= 36,
          f"dashboard: schemaVersion {dash.get('schemaVersion')} >= 36")
    check(isinstance(dash.get("uid"), str) and 0 < len(dash["uid"]) <= 40,
          "dashboard: uid of 1 to 40 characters (Grafana's limit)")
    check(dash.get("id") is None, "dashboard: id null (provisioning assigns one)")

    templating = dash.get("templating", {}).get("list", [])
    defined = {v.get("name") for v in templating}
    datasource_vars = [v for v in templating if v.get("type") == "datasource"]
    check(len(datasource_vars) == 1 and datasource_vars[0].get("query") == "prometheus",
          "dashboard: one datasource variable, of Prometheus datasources")
    ds_name = datasource_vars[0]["name"] if datasource_vars else "datasource"
    want_ds = {"type": "prometheus", "uid": "${%s}" % ds_name}
    for var in templating:
        if var.get("type") == "query":
            check(var.get("datasource") == want_ds,
                  f"dashboard: variable {var.get('name')} queries through ${ds_name}")
            query = var.get("query")
            text = query.get("query") if isinstance(query, dict) else query
            check(isinstance(text, str) and text.startswith("label_values("),
                  f"dashboard: variable {var.get('name')} is a label_values() query")

    ids, titles, boxes = set(), set(), []
    panels = dash.get("panels", [])
    check(len(panels) > 0, f"dashboard: {len(panels)} panels")
    for panel in panels:
        title = panel.get("title", "")
        name = f"dashboard: panel {panel.get('id')} '{title}'"
        check(isinstance(panel.get("id"), int) and panel["id"] not in ids, f"{name}: unique integer id")
        ids.add(panel.get("id"))
        check(panel.get("type") in PANEL_TYPES, f"{name}: known type {panel.get('type')}")
        check(bool(title) and title not in titles, f"{name}: unique title")
        titles.add(title)
        grid = panel.get("gridPos", {})
        ok = all(isinstance(grid.get(k), int) for k in "hwxy")
        ok = ok and grid["x"] >= 0 and grid["y"] >= 0 and grid["w"] >= 1 and grid["h"] >= 1
        ok = ok and grid["x"] + grid["w"] <= 24
        if not check(ok, f"{name}: gridPos {grid} inside the 24-column grid"):
            continue
        for other_name, o in boxes:
            overlap = (grid["x"] < o["x"] + o["w"] and o["x"] < grid["x"] + grid["w"]
                       and grid["y"] < o["y"] + o["h"] and o["y"] < grid["y"] + grid["h"])
            if overlap:
                check(False, f"{name}: overlaps {other_name}")
        boxes.append((name, grid))
        if panel.get("type") == "row":
            check(grid["w"] == 24 and grid["h"] == 1, f"{name}: a row spans the width")
            continue
        check(panel.get("datasource") == want_ds, f"{name}: datasource ${ds_name}")
        check("unit" in panel.get("fieldConfig", {}).get("defaults", {}), f"{name}: has a unit")
        targets = panel.get("targets", [])
        check(len(targets) > 0, f"{name}: has targets")
        refids = [t.get("refId") for t in targets]
        check(len(set(refids)) == len(refids) and all(refids), f"{name}: unique refIds {refids}")
        for target in targets:
            expr = target.get("expr")
            check(isinstance(expr, str) and expr.strip() != "", f"{name} {target.get('refId')}: has expr")
            check(target.get("datasource") == want_ds, f"{name} {target.get('refId')}: datasource ${ds_name}")
            undefined = variables_in(expr or "") - defined - GRAFANA_BUILTINS
            check(not undefined, f"{name} {target.get('refId')}: variables defined ({sorted(undefined) or 'all'})")


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def bind_mounts(service):
    """(host path relative to deploy/, container path) of every bind mount."""
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            parts = volume.split(":")
            if parts[0].startswith((".", "/")):
                out.append((parts[0], parts[1]))
        elif volume.get("type") == "bind":
            out.append((volume["source"], volume["target"]))
    return out


def check_compose(repo, podman_log):
    deploy = os.path.join(repo, "deploy")
    compose = load_yaml(os.path.join(deploy, "compose.yaml"))
    services = compose.get("services", {})
    check(set(services) >= {"attnserve", "front-door", "front-door-exporter", "prometheus",
                            "grafana"},
          f"compose: services {sorted(services)}")
    attnserve = services.get("attnserve", {})
    build = attnserve.get("build", {})
    context = os.path.normpath(os.path.join(deploy, build.get("context", "")))
    dockerfile = os.path.join(context, build.get("dockerfile", "Dockerfile"))
    check(os.path.isfile(dockerfile) and os.path.samefile(context, repo),
          f"compose: attnserve builds from {os.path.relpath(dockerfile, repo)} at the repository root")
    ports = {p.get("name"): p for p in attnserve.get("ports", []) if isinstance(p, dict)}
    check(str(ports.get("grpc", {}).get("target")) == "8001", "compose: port grpc is 8001")
    check(str(ports.get("http", {}).get("target")) == "8000", "compose: port http is 8000")
    check(str(ports.get("metrics", {}).get("target")) == "8002", "compose: port metrics is 8002")
    # The front door owns the grpc and http ports in attnserve's network
    # namespace; attnserve listens behind it on loopback, where the door
    # forwards.
    command = attnserve.get("command", [])
    with open(os.path.join(deploy, "nginx", "front-door.conf"), encoding="utf-8") as f:
        door_conf = re.sub(r"#.*", "", f.read())
    check("--host=127.0.0.1" in command and "--grpc_port=9001" in command and
          "server 127.0.0.1:9001;" in door_conf and "listen 8001 http2;" in door_conf,
          "compose: attnserve on 127.0.0.1:9001 behind the front door on 8001")
    check("--http_port=9000" in command and
          not any(c.startswith("--http_host=") for c in command) and
          "server 127.0.0.1:9000;" in door_conf and re.search(r"\blisten 8000;", door_conf),
          "compose: attnserve's HTTP on 127.0.0.1:9000 (--http_host defaults to --host) "
          "behind the front door on 8000")
    for name in ("front-door", "front-door-exporter"):
        check(services.get(name, {}).get("network_mode") == "service:attnserve",
              f"compose: {name} shares attnserve's network namespace")
    check("/etc/attnserve/front-door.conf" in services.get("front-door", {}).get("entrypoint", []),
          "compose: the front door runs the image's front-door.conf")
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test")
        check(bool(test), f"compose: {name} has a healthcheck")
        for source, target in bind_mounts(service):
            check(os.path.exists(os.path.join(deploy, source)),
                  f"compose: {name} mounts {source} (exists) at {target}")

    # Prometheus: its mounted config scrapes attnserve's metrics port by the
    # compose service name.
    prom_mounts = dict(bind_mounts(services.get("prometheus", {})))
    config_dir = [s for s, t in prom_mounts.items() if t == "/etc/prometheus"]
    check(config_dir == ["./prometheus"], "compose: deploy/prometheus mounted at /etc/prometheus")
    prom_cmd = " ".join(services.get("prometheus", {}).get("command", []))
    check("--config.file=/etc/prometheus/prometheus.yml" in prom_cmd,
          "compose: prometheus reads /etc/prometheus/prometheus.yml")
    prom_config = load_yaml(os.path.join(deploy, "prometheus", "prometheus.yml"))
    targets = [t for job in prom_config.get("scrape_configs", []) if job.get("job_name") == "attnserve"
               for sc in job.get("static_configs", []) for t in sc.get("targets", [])]
    check(targets == ["attnserve:8002"], f"prometheus.yml: job attnserve scrapes {targets}")
    door_targets = [t for job in prom_config.get("scrape_configs", [])
                    if job.get("job_name") == "attnserve-front-door"
                    for sc in job.get("static_configs", []) for t in sc.get("targets", [])]
    check(door_targets == ["attnserve:9113"],
          f"prometheus.yml: job attnserve-front-door scrapes {door_targets}")

    # Grafana: provisioning mounted where Grafana reads it; the provider's
    # path is where the dashboards are mounted; the datasource is the
    # compose Prometheus.
    graf_mounts = {t: s for s, t in bind_mounts(services.get("grafana", {}))}
    check(graf_mounts.get("/etc/grafana/provisioning") == "./grafana/provisioning",
          "compose: deploy/grafana/provisioning mounted at /etc/grafana/provisioning")
    providers = load_yaml(os.path.join(deploy, "grafana", "provisioning", "dashboards", "attnserve.yaml"))
    check(providers.get("apiVersion") == 1, "grafana: dashboard provider apiVersion 1")
    for provider in providers.get("providers", []):
        path = provider.get("options", {}).get("path")
        check(provider.get("type") == "file" and graf_mounts.get(path) == "./grafana/dashboards",
              f"grafana: provider {provider.get('name')} reads {path}, where deploy/grafana/dashboards is mounted")
    home = services.get("grafana", {}).get("environment", {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        local = os.path.join(deploy, "grafana", "dashboards", os.path.basename(home))
        check(os.path.dirname(home) in graf_mounts and os.path.isfile(local),
              f"grafana: home dashboard {home} is a mounted file")
    sources = load_yaml(os.path.join(deploy, "grafana", "provisioning", "datasources", "prometheus.yaml"))
    check(sources.get("apiVersion") == 1, "grafana: datasource apiVersion 1")
    proms = [d for d in sources.get("datasources", []) if d.get("type") == "prometheus"]
    check(len(proms) == 1 and proms[0].get("url") == "http://prometheus:9090",
          "grafana: one Prometheus datasource, http://prometheus:9090 (the compose service)")
    interval = prom_config.get("global", {}).get("scrape_interval")
    check(proms and proms[0].get("jsonData", {}).get("timeInterval") == interval,
          f"grafana: datasource timeInterval = prometheus.yml's scrape_interval ({interval})")

    # What podman-compose made of it: the published ports and healthchecks
    # reach the podman command lines.
    with open(podman_log, encoding="utf-8") as f:
        log = f.read()
    creates = [line for line in log.splitlines() if "podman create" in line]
    check(len(creates) == 5, f"podman-compose: {len(creates)} containers to create")
    for service, ports in (("attnserve", ("127.0.0.1:8000:8000", "127.0.0.1:8001:8001",
                                          "127.0.0.1:8002:8002", "127.0.0.1:9113:9113")),
                           ("front-door", ()),
                           ("front-door-exporter", ()),
                           ("prometheus", ("127.0.0.1:9090:9090",)),
                           ("grafana", ("127.0.0.1:3000:3000",))):
        line = next((c for c in creates if f"--name=attnserve_{service}_1" in c), "")
        for port in ports:
            check(f"-p {port}" in line, f"podman-compose: {service} publishes {port}")
        check("--health-cmd" in line, f"podman-compose: {service} gets its healthcheck")


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 64
    repo, podman_log = argv
    check_dashboard(os.path.join(repo, "deploy", "grafana", "dashboards", "attnserve.json"))
    check_compose(repo, podman_log)
    print(f"files_check: {CHECKS[0]} checks of the dashboard, Grafana provisioning and "
          f"compose wiring, {len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

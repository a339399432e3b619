"""The monitoring files against a real Prometheus scraping a real attnserve.

  python live_check.py config REPO OUT ATTNSERVE_METRICS PROMETHEUS_ADDR
      Writes OUT: deploy/prometheus/prometheus.yml with the scrape and rule
      evaluation intervals at 1 s, job attnserve pointed at the test
      server's metrics address, the self-scrape at the test Prometheus, and
      the rule files by absolute path (the same files, unchanged).

  python live_check.py serving REPO PROMETHEUS_URL
      After a load with errors (monitoring_test.sh): waits for the data,
      then evaluates through the HTTP API (/api/v1/query, query_range,
      series, rules) every recording rule, every alert and every dashboard
      expression. Fails on any query error, and on no data wherever data must
      exist (the comment above SERVING_ASSERTIONS says where none may).

  python live_check.py down REPO PROMETHEUS_URL
      After the server is stopped: AttnserveTargetDown's expression returns
      the target, and Prometheus itself makes the alert pending.

Prints each failed check and a count; exit 1 if any failed. Standard library
and PyYAML only.
"""

import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

FAILURES = []
CHECKS = [0]

# Grafana fills $__rate_interval with max(4 x scrape interval, step +
# scrape interval): 1m with the provisioned datasource's timeInterval of 15s.
# The test uses the same window as production, so the expressions are the
# ones users run.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}

# The RPCs monitoring_test.sh drives; their latency quantiles must be finite.
DRIVEN_RPCS = ["ScaledDotProductAttention", "MaskedSoftmax", "BatchMatmul",
               "AdditiveAttention", "NadarayaWatson", "FitBandwidth"]

# Where no data is legitimate: in the serving phase every alert expression
# must return nothing (the load is healthy: its RESOURCE_EXHAUSTED share
# stays under the 5 % threshold, its latency far under 0.5 s), yet each
# alert's probe (alert_probe) must return data. AttnserveTargetMissing's
# absent() is empty exactly while the target exists, which its probe checks.
# Everything else (every recording rule, recorded series and dashboard
# query) must return data.

# What the load must have produced, as PromQL that returns data only when
# it holds: values, not just series.
SERVING_ASSERTIONS = [
    'job_rpc_code:attnserve_requests:rate1m{rpc="ScaledDotProductAttention",code="OK"} > 0',
    'job_rpc_code:attnserve_requests:rate1m{rpc="ScaledDotProductAttention",code="INVALID_ARGUMENT"} > 0',
    'job_rpc_code:attnserve_requests:rate1m{rpc="ScaledDotProductAttention",code="RESOURCE_EXHAUSTED"} > 0',
    'job_rpc:attnserve_requests_failed_per_requests:ratio_rate1m{rpc="ScaledDotProductAttention"} > 0 < 1',
    'job_rpc:attnserve_requests_server_errors_per_requests:ratio_rate1m{rpc="ScaledDotProductAttention"} > 0 < 0.05',
    'job_rpc_reason:attnserve_rejected_requests:rate1m{rpc="ScaledDotProductAttention",reason="resource_exhausted"} > 0',
    # Whichever backend ran it (onednn-cpu here, cuda on a GPU machine).
    'job_rpc_backend:attnserve_kernel_duration_seconds:p99_rate1m{rpc="ScaledDotProductAttention"} > 0',
    'job_rpc_implementation:attnserve_kernel_runs:rate1m{rpc="ScaledDotProductAttention"} > 0',
    'job_rpc:attnserve_batch_size:mean_rate1m{rpc="ScaledDotProductAttention"} >= 1',
    'job_rpc:attnserve_batches:rate1m{rpc="ScaledDotProductAttention"} > 0',
    # Ragged batching (--lk_range) pads.
    'job_rpc:attnserve_batch_padding_elements_per_computed_elements:ratio_rate1m{rpc="ScaledDotProductAttention"} > 0 < 1',
    'job:attnserve_queue_depth:sum >= 0',
    'job:attnserve_inflight_requests:sum >= 0',
] + [
    # p50 <= p99, both finite and positive, for every RPC driven (a NaN
    # fails every comparison).
    f'job_rpc:{m}:p50_rate1m{{rpc="{rpc}"}} > 0 <= on (job, rpc) job_rpc:{m}:p99_rate1m < 100'
    for rpc in DRIVEN_RPCS
    for m in ("attnserve_request_duration_seconds", "attnserve_queue_wait_seconds")
]


def check(ok, what):
    CHECKS[0] += 1
    if not ok:
        print("FAIL " + what)
        FAILURES.append(what)
    return ok


def api(base, path, params):
    """GET base/path?params; returns (data, error string or None)."""
    url = f"{base}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as e:
        try:
            body = json.load(e)
        except ValueError:
            return None, f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, str(e)
    if body.get("status") != "success":
        return None, f"{body.get('errorType')}: {body.get('error')}"
    return body["data"], None


def query(base, expr):
    data, error = api(base, "/api/v1/query", {"query": expr})
    return (data or {}).get("result", []), error


def query_range(base, expr, seconds=60, step=2):
    end = time.time()
    data, error = api(base, "/api/v1/query_range",
                      {"query": expr, "start": end - seconds, "end": end, "step": step})
    return (data or {}).get("result", []), error


def finite_values(result):
    values = []
    for series in result:
        for _, v in series.get("values", []) + ([series["value"]] if "value" in series else []):
            if not math.isnan(float(v)):
                values.append(float(v))
    return values


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def rules_of(repo, kind):
    """(name, expr) of every rule in deploy/prometheus's rule files."""
    config = load_yaml(os.path.join(repo, "deploy", "prometheus", "prometheus.yml"))
    out = []
    for rule_file in config["rule_files"]:
        for group in load_yaml(os.path.join(repo, "deploy", "prometheus", rule_file))["groups"]:
            for rule in group["rules"]:
                if kind in rule:
                    out.append((rule[kind], rule["expr"].strip()))
    return out


COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(?!~)")


def bool_form(expr):
    """expr with `bool` after every top-level comparison operator.

    A comparison filters: `x > 0.5` returns nothing while x <= 0.5, which is
    what an alert wants and what cannot tell "below the threshold" from "no
    such series". With `bool` every series comes back as 0 or 1, so an
    empty answer means a missing series or a label that matches nothing.
    Label matchers and strings are left alone.
    """
    out, i, depth, quote = [], 0, 0, None
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif c == "{":
            depth += 1
            out.append(c)
        elif c == "}":
            depth -= 1
            out.append(c)
        elif depth == 0 and (m := COMPARISON.match(expr, i)) and not expr[i:i + 2] in ("=~", "!~"):
            op = m.group(1)
            out.append(op)
            i += len(op)
            if not re.match(r"\s*bool\b", expr[i:]):
                out.append(" bool")
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def alert_probe(expr):
    """The expression that must return data for the alert to be able to fire:
    the inside of absent(...), or the alert's expression in bool form."""
    m = re.fullmatch(r"absent\((.*)\)", expr, re.S)
    return m.group(1) if m else bool_form(expr)


# --- config -----------------------------------------------------------------

def write_config(repo, out, target, prometheus_addr, door_exporter=None):
    path = os.path.join(repo, "deploy", "prometheus", "prometheus.yml")
    config = load_yaml(path)
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    config["rule_files"] = [os.path.join(os.path.dirname(path), f) for f in config["rule_files"]]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    if "attnserve" not in jobs:
        print("FAIL prometheus.yml has no job attnserve")
        return 1
    jobs["attnserve"]["static_configs"] = [{"targets": [target]}]
    if "prometheus" in jobs:
        jobs["prometheus"]["static_configs"] = [{"targets": [prometheus_addr]}]
    if "attnserve-front-door" in jobs:
        if door_exporter is None:
            print("FAIL prometheus.yml has the front door's job; give its exporter's address")
            return 1
        jobs["attnserve-front-door"]["static_configs"] = [{"targets": [door_exporter]}]
    with open(out, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return 0


# --- serving ----------------------------------------------------------------

def wait_for(base, exprs, timeout_s):
    """Polls until every expr returns data; returns those that never did."""
    deadline = time.time() + timeout_s
    pending = list(exprs)
    while True:
        pending = [e for e in pending if not query(base, e)[0]]
        if not pending or time.time() > deadline:
            return pending
        time.sleep(0.5)


def grafana_variables(base, dashboard):
    """Fills each query variable as Grafana would, through the same API
    Grafana's label_values() uses; returns {name: value} for substitution."""
    values = dict(GRAFANA_BUILTINS)
    for var in dashboard["templating"]["list"]:
        name = var["name"]
        if var["type"] == "datasource":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        q = substitute(q, values)
        m = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", q.strip(), re.S)
        if not check(m is not None, f"dashboard variable {name}: label_values() query: {q}"):
            continue
        selector, label = m.group(1), m.group(2)
        params = {"match[]": selector} if selector else {}
        data, error = api(base, f"/api/v1/label/{label}/values", params)
        check(error is None, f"dashboard variable {name}: {q}: {error}")
        check(bool(data), f"dashboard variable {name}: {q} has values")
        if not data:
            continue
        if var.get("includeAll") and var.get("allValue"):
            values[name] = var["allValue"]      # "All", the default
        else:
            values[name] = "attnserve" if "attnserve" in data else data[0]
        if name == "job":
            check("attnserve" in data, f"dashboard variable job offers attnserve ({data})")
    return values


def substitute(expr, values):
    def one(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, m.group(0))
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", one, expr)


def serving(repo, base):
    records = rules_of(repo, "record")
    alerts = rules_of(repo, "alert")
    with open(os.path.join(repo, "deploy", "grafana", "dashboards", "attnserve.json"), encoding="utf-8") as f:
        dashboard = json.load(f)

    # The data: every recorded series and every assertion, within 30 s (the
    # rules run every second; the load has already ended).
    missing = wait_for(base, [name for name, _ in records] + SERVING_ASSERTIONS, 30)
    for expr in missing:
        check(False, f"no data within 30 s: {expr}")

    # Prometheus's own view of the rules: every group loaded, every rule
    # evaluated without error.
    data, error = api(base, "/api/v1/rules", {})
    check(error is None, f"/api/v1/rules: {error}")
    loaded = [r for g in (data or {}).get("groups", []) for r in g["rules"]]
    check(len(loaded) == len(records) + len(alerts),
          f"Prometheus loaded {len(loaded)} rules, the files hold {len(records) + len(alerts)}")
    for rule in loaded:
        check(rule.get("health") == "ok" and not rule.get("lastError"),
              f"rule {rule.get('name')}: health {rule.get('health')} {rule.get('lastError', '')}")

    # Recording rules: the expression evaluates with data, and so does the
    # series Prometheus recorded from it.
    for name, expr in records:
        result, error = query(base, expr)
        check(error is None, f"record {name}: expr: {error}")
        check(bool(result), f"record {name}: expr returns data")
        result, error = query(base, name)
        check(error is None and bool(result), f"record {name}: recorded series present")
    for expr in SERVING_ASSERTIONS:
        check(bool(query(base, expr)[0]), f"holds: {expr}")

    # Alerts: each expression evaluates; its probe has data (every series it
    # reads exists with the labels it matches on); and it is silent while
    # the server is healthy, in Prometheus's ALERTS too.
    for name, expr in alerts:
        result, error = query(base, expr)
        check(error is None, f"alert {name}: expr: {error}")
        check(not result, f"alert {name}: silent while serving (got {len(result)} series)")
        probe = alert_probe(expr)
        result, error = query(base, probe)
        check(error is None, f"alert {name}: probe: {error}")
        check(bool(result), f"alert {name}: probe returns data: {probe}")
    result, _ = query(base, 'ALERTS{alertname=~"Attnserve.*"}')
    check(not result, f"no attnserve alert pending or firing: {[r['metric'] for r in result]}")

    # Dashboard: variables as Grafana fills them, then every target as a
    # range query (what a panel sends) over the last minute, which must hold
    # at least one number (not only NaN).
    values = grafana_variables(base, dashboard)
    used = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = substitute(target["expr"], values)
            where = f"panel '{panel['title']}' {target['refId']}"
            if not check("$" not in expr, f"{where}: every variable substituted: {expr}"):
                continue
            result, error = query_range(base, expr)
            check(error is None, f"{where}: {error}")
            check(bool(finite_values(result)), f"{where}: returns data: {expr}")
            used.update(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))

    # Every family attnserve exports is on the dashboard (a new metric needs
    # a panel). Histograms count by their _bucket/_sum/_count series; left
    # out: prometheus-cpp's own exposer_* families, Prometheus's per-target
    # series (up, scrape_*), and what the rules wrote (level:metric:ops
    # names, ALERTS).
    data, error = api(base, "/api/v1/label/__name__/values", {"match[]": '{job="attnserve"}'})
    check(error is None, f"metric names: {error}")
    exported = {re.sub(r"_(bucket|sum|count)$", "", n) for n in data or []
                if not n.startswith(("exposer_", "scrape_", "ALERTS"))
                and n != "up" and ":" not in n}
    on_dashboard = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    for family in sorted(exported - on_dashboard):
        check(False, f"dashboard: exported family {family} is on no panel")
    print(f"live_check: {len(records)} recording rules, {len(alerts)} alerts, "
          f"{sum(len(p.get('targets', [])) for p in dashboard['panels'])} dashboard queries, "
          f"{len(exported)} exported families")


# --- down -------------------------------------------------------------------

def down(repo, base):
    expr = dict(rules_of(repo, "alert"))["AttnserveTargetDown"]
    missing = wait_for(base, [expr], 15)
    check(not missing, f"AttnserveTargetDown: {expr} returns the stopped target within 15 s")
    missing = wait_for(base, ['ALERTS{alertname="AttnserveTargetDown",alertstate="pending",severity="critical"}'], 10)
    check(not missing, "AttnserveTargetDown: pending in Prometheus (fires after its for: 1m)")
    result, _ = query(base, 'ALERTS{alertname=~"Attnserve.*",alertname!="AttnserveTargetDown"}')
    check(not result, f"no other attnserve alert: {[r['metric'] for r in result]}")


def main(argv):
    if len(argv) in (5, 6) and argv[0] == "config":
        return write_config(*argv[1:])
    if len(argv) == 3 and argv[0] in ("serving", "down"):
        (serving if argv[0] == "serving" else down)(argv[1], argv[2].rstrip("/"))
        print(f"live_check {argv[0]}: {CHECKS[0]} checks, {len(FAILURES)} failed")
        return 1 if FAILURES else 0
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

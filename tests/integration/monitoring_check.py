#!/usr/bin/env python3
"""Checks of the packaged monitoring files (tests/integration/metrics.cmake).

  monitoring_check.py rules ALERTS_YML TESTS_YML RUNBOOK_MD
      Every alert has a summary, a description and a runbook_url naming a
      section of the runbook, and at least one promtool test case in which it
      fires.

  monitoring_check.py dashboard DASHBOARD_JSON ALERTS_YML PROMETHEUS GPUMEMD GPUMEMCTL CLIENT
      A real gpumemd (host backend, a configured GPU UUID, this script playing
      systemd's notification socket and fd store) with real clients (CLIENT:
      gm-test-client, tests/integration/test_client_tool.c), scraped by a real Prometheus that also loads
      the alert rules. The clients cache memory, take it back through a
      reclaim, and are refused by a quota. Every query of the Grafana
      dashboard (panels and template variables) must return data, and every
      rule must evaluate without error.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import yaml


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


# Every runbook_url: the operator's base (the external label
# gpumemd_runbook_url), else the installed runbook; then "#section".
RUNBOOK_BASE = ("{{ with $externalLabels.gpumemd_runbook_url }}{{ . }}{{ else }}"
                "file:///usr/share/doc/gpumemd/runbook.md{{ end }}")


def alert_rules(path):
    with open(path) as f:
        doc = yaml.safe_load(f)
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def check_rules(alerts_path, tests_path, runbook_path):
    with open(runbook_path) as f:
        # GitHub's anchors: the heading in lower case, punctuation dropped.
        anchors = {re.sub(r"[^a-z0-9 _-]", "", m.group(1).strip().lower()).replace(" ", "-")
                   for m in re.finditer(r"^#+ (.+)$", f.read(), re.M)}
    with open(tests_path) as f:
        tests = yaml.safe_load(f)["tests"]
    firing = {t["alertname"] for case in tests for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    rules = alert_rules(alerts_path)
    if not rules:
        fail("no alert rules in " + alerts_path)
    for r in rules:
        name, ann = r["alert"], r.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not ann.get(key):
                fail(f"{name} has no {key}")
        url = ann["runbook_url"]
        if not url.startswith(RUNBOOK_BASE + "#"):
            fail(f"{name}: runbook_url {url} is not the configurable runbook base ({RUNBOOK_BASE}) and a section")
        if url.split("#", 1)[1] not in anchors:
            fail(f"{name}: {url} names no section of {runbook_path}")
        if name not in firing:
            fail(f"{name} has no promtool test case in which it fires")
        if r.get("labels", {}).get("severity") not in ("warning", "critical"):
            fail(f"{name} has no severity warning or critical")
    print(f"{len(rules)} alerts: each described, linked to the runbook and tested")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.1)
    fail("timed out waiting for " + what)


def dashboard_queries(dash):
    """(where, expr) of every panel target and query variable."""
    ids = set()
    for p in dash["panels"]:
        if p["id"] in ids:
            fail(f"panel id {p['id']} is used twice")
        ids.add(p["id"])
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            fail(f"panel {p['title']} is wider than the grid")
        if p["type"] == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}" or not p.get("targets"):
            fail(f"panel {p['title']} has no targets on the datasource variable")
        for t in p["targets"]:
            yield f"panel '{p['title']}' {t['refId']}", t["expr"]
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"])
        if not m:
            fail(f"variable {v['name']}: unexpected query {v['query']['query']}")
        yield f"variable {v['name']}", (m.group(1), m.group(2))


def play_systemd(path):
    """A notification socket like systemd's: reads every message and closes
    the fds handed to the store (the daemon only needs them accepted)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)

    def serve():
        while True:
            try:
                _, fds, _, _ = socket.recv_fds(sock, 4096, 64)
            except OSError:
                return
            for fd in fds:
                os.close(fd)

    threading.Thread(target=serve, daemon=True).start()
    return sock


def check_dashboard(dash_path, alerts_path, prometheus, gpumemd, gpumemctl, client):
    with open(dash_path) as f:
        dash = json.load(f)
    queries = list(dashboard_queries(dash))
    procs = []
    tmp = tempfile.mkdtemp(prefix="gpumem-dash-")
    notify = None

    def spawn(*argv, **kw):
        p = subprocess.Popen(argv, **kw)
        procs.append(p)
        return p

    try:
        sock = os.path.join(tmp, "gpu0.sock")
        mport, pport = free_port(), free_port()
        notify = play_systemd(os.path.join(tmp, "notify"))
        env = dict(os.environ, NOTIFY_SOCKET=os.path.join(tmp, "notify"))
        spawn(gpumemd, "--backend", "host", "--capacity", "64M", "--socket", sock, "--config", "/dev/null",
              "--device", "GPU-8f6c2a3e-1b2c-4d5e-8f90-0123456789ab", "--metrics-listen", f"127.0.0.1:{mport}",
              env=env, stderr=open(os.path.join(tmp, "gpumemd.log"), "w"))
        wait_for("the daemon's socket", lambda: os.path.exists(sock))
        tenant = f"uid:{os.getuid()}"

        def run_client(mib, mode):
            # hold SIZE SEED keeps a block; cache SIZE 1 frees it into the session's cache.
            p = spawn(client, sock, mode, str(mib << 20), "1", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.DEVNULL, text=True)
            return p, p.stdout.readline().strip() == "ready"

        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            yaml.safe_dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                            "rule_files": [os.path.abspath(alerts_path)],
                            "scrape_configs": [{"job_name": "gpumemd",
                                                "static_configs": [{"targets": [f"127.0.0.1:{mport}"]}]}]}, f)
        spawn(prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb",
              f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn",
              stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"))
        base = f"http://127.0.0.1:{pport}/api/v1/"

        def api(path, **params):
            url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
            if body.get("status") != "success":
                fail(f"{url}: {body}")
            return body["data"]

        def scraped():
            res = api("query", query='up{job="gpumemd"} == 1')["result"]
            return bool(res)

        wait_for("Prometheus to scrape gpumemd", scraped, timeout=30)
        # The workload runs while Prometheus scrapes, so rates see it.
        # 40 MiB cached in one session; another's 40 MiB (of 64) needs it back
        # through a reclaim; with a quota of 50 MiB a third's 20 are refused.
        cacher, ok = run_client(40, "cache")
        taker, ok2 = run_client(40, "hold")
        if not ok or not ok2:
            fail("the clients did not get their memory: " + open(os.path.join(tmp, "gpumemd.log")).read())
        subprocess.run([gpumemctl, "-s", sock, "quota", "set", tenant, "50M", "--runtime"], check=True,
                       stdout=subprocess.DEVNULL)
        refused, ok = run_client(20, "hold")
        refused.wait(timeout=10)
        if ok or refused.returncode == 0:
            fail("the quota did not refuse the third client")

        # A few scrapes more; the window covers the workload.
        window = "30s"
        time.sleep(4)
        empty = []
        for where, expr in queries:
            if isinstance(expr, tuple):
                metric, label = expr
                res = api("query", query=metric.replace("$instance", ".+"))["result"]
                if not any(label in r["metric"] for r in res):
                    empty.append(f"{where}: no {label} label on {metric}")
                continue
            q = expr.replace("$__rate_interval", window).replace("$instance", ".+").replace("$device", ".+")
            # At least one series with a number (not NaN: a quantile of nothing).
            values = [float(r["value"][1]) for r in api("query", query=q)["result"]]
            if not any(v == v for v in values):
                empty.append(f"{where}: {q} -> {values}")
        if empty:
            fail("queries without data:\n  " + "\n  ".join(empty))
        groups = api("rules", type="alert")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        bad = [f"{r['name']}: {r.get('lastError')}" for r in rules if r.get("health") != "ok"]
        if len(rules) != len(alert_rules(alerts_path)) or bad:
            fail(f"{len(rules)} rules loaded; not evaluating: {bad}")
        for p in (cacher, taker):
            p.stdin.close()
            if p.wait(timeout=10) != 0:
                fail("a client failed")
        print(f"{len(queries)} dashboard queries return data; {len(rules)} alert rules evaluate")
    finally:
        if notify:
            notify.close()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "rules":
        check_rules(*sys.argv[2:])
    elif len(sys.argv) == 8 and sys.argv[1] == "dashboard":
        check_dashboard(*sys.argv[2:])
    else:
        fail(__doc__)

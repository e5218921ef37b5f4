#!/usr/bin/env python3
"""The module arrows point one way: main -> server -> requests -> broker ->
{allocator, backend}; torch -> libgpumem -> {allocator, mapper, ipc, common}
(a local session's heap and memory_summary() formatting run in the client);
ctl -> {libgpumem's admin API, allocator, common}, with no wire code. Fails (exit 1) naming every
project include of a header from a module above, or beside, the includer's.
Inside broker/, libgpumem/, daemon/ and ctl/ the files stand on floors
(BROKER_FLOOR, LIBGPUMEM_FLOOR, DAEMON_FLOOR, CTL_FLOOR): a file includes only headers
of its floor or below, calls only functions defined on its floor or below,
and no two files call each other.
Usage: check-layers.py [SOURCE_DIR]"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))

# Layer of a file: the daemon's files by role, every other module by directory.
# The daemon's floors, top down: main -> server -> the request table ->
# one floor per request family (req_*.c: none may include another's) ->
# the request side's bottom floor (the connection type and reply helpers,
# local sessions' life and figures, sampling) -> the daemon's leaves.
REQUEST_FAMILIES = ("session", "central", "local", "admin", "snapshot", "samples", "claim", "shared")
REQ_LAYERS = {f"req-{f}" for f in REQUEST_FAMILIES}
DAEMON_LAYER = {
    "main.c": "main",
    "server.c": "server", "daemon.h": "server",
    "requests.c": "table", "requests.h": "table",
    "request.c": "request", "request.h": "request",
    "local.c": "request", "local.h": "request",
    "localstats.c": "request", "localstats.h": "request",
    "diag.c": "request", "diag.h": "request",
}
for family in REQUEST_FAMILIES:
    DAEMON_LAYER[f"req_{family}.c"] = DAEMON_LAYER[f"req_{family}.h"] = f"req-{family}"
BELOW_DAEMON = {"broker", "allocator", "backend", "ipc", "common", "proto"}
# What each layer may include (besides itself).
MAY_USE = {
    "main": {"server", "table", "request", "daemon-leaf"} | REQ_LAYERS | BELOW_DAEMON,
    "server": {"table", "request", "daemon-leaf"} | REQ_LAYERS | BELOW_DAEMON,
    "table": {"request", "daemon-leaf"} | REQ_LAYERS | BELOW_DAEMON,
    **{req: {"request", "daemon-leaf"} | BELOW_DAEMON for req in REQ_LAYERS},
    "request": {"daemon-leaf"} | BELOW_DAEMON,
    "daemon-leaf": set(BELOW_DAEMON),
    "broker": {"allocator", "backend", "backend-kind", "common"},
    "allocator": {"common"},
    "backend-kind": set(),
    "backend": {"common", "backend-kind"},
    "ipc": {"common", "proto"},
    "common": set(),
    "libgpumem": {"allocator", "ipc", "common", "proto", "backend-loader", "mapper"},
    "ctl": {"libgpumem", "allocator", "common"},  # libgpumem's admin API only: no wire code
    "torch": {"libgpumem"},
    "examples": {"libgpumem"},
    "mapper": {"backend-loader", "backend-kind", "common"},
}
KNOWN = set()

# The broker's floors, bottom up (broker/broker-internal.h draws them).
# broker.h (the public API and types) and broker-internal.h (the private
# structures) are shared by every floor; session_central.c and
# session_local.c stand on session.c within the holders' floor.
BROKER_FLOOR = {
    "broker.h": 0, "broker-internal.h": 0,
    "books.h": 1, "host.c": 1, "outcome.c": 1, "tenant.c": 1, "ledger.c": 1, "claim.c": 1, "checker.c": 1, "tags.c": 1,
    "piece.h": 2, "piece.c": 2, "orphan.c": 2, "process_check.c": 2, "shared.c": 2,
    "holder.h": 3, "session.c": 3, "session_central.c": 3.5, "session_local.c": 3.5,
    "reclaim.h": 4, "reclaim.c": 4,
    "broker.c": 5, "reattach.c": 5,
}


def layer_of(rel):
    top, _, rest = rel.partition("/")
    if top == "daemon":
        return DAEMON_LAYER.get(rest, "daemon-leaf")
    if top == "backend" and os.path.basename(rest).startswith("cuda_loader"):
        return "backend-loader"
    if top == "backend" and (os.path.basename(rest).startswith("mapper") or rest == "kind.h"):
        return "mapper" if rest != "kind.h" else "backend-kind"
    return top


headers = {}
MODULES = ("common", "allocator", "backend", "ipc", "broker", "daemon", "libgpumem", "ctl", "torch", "examples")
for top in MODULES:
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for f in files:
            if f.endswith(".h"):
                headers.setdefault(f, os.path.relpath(os.path.join(dirpath, f), root))
headers["gpumem.pb-c.h"] = "proto/gpumem.pb-c.h"

bad = []
for dirpath, _, files in os.walk(root):
    rel_dir = os.path.relpath(dirpath, root)
    if rel_dir.split("/")[0] not in MODULES:
        continue
    for f in files:
        if not f.endswith((".c", ".h")):
            continue
        rel = os.path.join(rel_dir, f)
        mine = layer_of(rel)
        if mine == "backend-loader":
            mine = "backend"
        allowed = MAY_USE.get(mine, set()) | {mine}
        with open(os.path.join(root, rel), errors="replace") as src:
            for n, line in enumerate(src, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                name = os.path.basename(m.group(1))
                target = headers.get(name)
                if not target:
                    continue
                theirs = layer_of(target)
                if theirs == "backend-loader" and mine not in ("libgpumem", "mapper"):
                    theirs = "backend"
                if theirs not in allowed and (rel, name) not in KNOWN:
                    bad.append(f"{rel}:{n}: {mine} includes {target} ({theirs})")

def strip_c(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


def check_floors(module, floor_of, prefixes=("gm", "gpumem")):
    """Inside `module` the files stand on floors (floor_of: file -> number):
    a file includes only headers of its floor or below, calls only functions
    defined on its floor or below, and no two files call each other."""
    mod_dir = os.path.join(root, module)
    files = sorted(f for f in os.listdir(mod_dir) if f.endswith((".c", ".h")))
    for f in files:
        if f not in floor_of:
            bad.append(f"{module}/{f}: on no floor of the {module} floor map")
    defined, calls = {}, {}
    for f in files:
        if f not in floor_of:
            continue
        with open(os.path.join(mod_dir, f), errors="replace") as src:
            text = src.read()
        for n, line in enumerate(text.split("\n"), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m and m.group(1) in floor_of and floor_of[m.group(1)] > floor_of[f]:
                bad.append(f"{module}/{f}:{n}: floor {floor_of[f]} includes {m.group(1)} (floor {floor_of[m.group(1)]})")
        if f.endswith(".c"):
            code = strip_c(text)
            names = "(?:" + "|".join(prefixes) + ")_\\w+"
            for m in re.finditer(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b(" + names + r")\s*\([^;{]*\)\s*\{", code, re.M):
                defined[m.group(1)] = f
            calls[f] = set(re.findall(r"\b(" + names + r")\s*\(", code))
    arrows = {}
    for f, names in calls.items():
        for name in sorted(names):
            callee = defined.get(name)
            if callee and callee != f:
                arrows.setdefault((f, callee), []).append(name)
    for (f, callee), names in sorted(arrows.items()):
        if floor_of[callee] > floor_of[f]:
            bad.append(f"{module}/{f}: floor {floor_of[f]} calls {callee} (floor {floor_of[callee]}): {' '.join(names)}")
        if (callee, f) in arrows and f < callee:
            bad.append(f"{module}/{f} and {module}/{callee} call each other")


# libgpumem's floors, bottom up (libgpumem/gpumem.c's header comment draws
# them): the connection, the segment table, the session, the heaps, the
# public API, the admin API. A lower floor reaches an upper one only through
# the callback tables conn.h and session.h document.
LIBGPUMEM_FLOOR = {
    "client_state.h": 0, "fence.c": 0, "fence.h": 0, "peer_check.c": 0, "peer_check.h": 0,
    "pool.c": 0, "pool.h": 0, "capture.c": 0, "capture.h": 0,
    "conn.c": 1, "conn.h": 1, "control.c": 1, "control.h": 1,
    "mapping.c": 2, "mapping.h": 2,
    "session.c": 3, "session.h": 3,
    "frees.c": 4, "frees.h": 4, "local_heap.c": 4, "local_heap.h": 4, "shared.c": 4,
    "central.c": 4.5, "central.h": 4.5, "local_session.c": 4.5, "local_session.h": 4.5,
    "sleep.c": 4.7, "sleep.h": 4.7,
    "gpumem.c": 5, "client-internal.h": 5,
    "claim.c": 5.5, "claim.h": 5.5,
    "admin.c": 6,
}
# The daemon's floors (the include check above also keeps the request
# families apart). request.h and metrics.h carry types every request file
# shares (the connection, the metric names), so they stand at floor 0; the
# call check still holds their functions above the floors that call them.
DAEMON_FLOOR = {f: 0 for f in ("log.c", "log.h", "memfd.c", "memfd.h", "identity.c", "identity.h", "http_guard.c",
                               "http_guard.h", "sd.c", "sd.h", "localstats.c", "localstats.h", "request.h", "metrics.h")}
DAEMON_FLOOR.update({"config.c": 1, "config.h": 1, "metrics.c": 1, "diag.c": 1, "diag.h": 1,
                     "request.c": 2, "local.c": 3, "local.h": 3,
                     "requests.c": 5, "requests.h": 5, "server.c": 6, "daemon.h": 6, "main.c": 7})
for family in REQUEST_FAMILIES:
    DAEMON_FLOOR[f"req_{family}.c"] = DAEMON_FLOOR[f"req_{family}.h"] = 4
check_floors("broker", BROKER_FLOOR)
check_floors("libgpumem", LIBGPUMEM_FLOOR)
check_floors("daemon", DAEMON_FLOOR)
# gpumemctl: the commands over the connection they share.
CTL_FLOOR = {"json_read.c": 0, "json_read.h": 0, "diagnose.c": 0, "diagnose.h": 0,
             "ctl.c": 1, "gpumemctl.h": 1, "gpumemctl_top.c": 2, "gpumemctl_shared.c": 2, "gpumemctl.c": 3}
check_floors("ctl", CTL_FLOOR, prefixes=("gm", "gpumem", "ctl", "cmd", "diag", "json"))
for b in bad:
    print(b)
sys.exit(1 if bad else 0)

#!/usr/bin/env python3
"""Messages a local page-reuse heap sends for physical memory (a benchmark, not a test).

Usage: grants.py GPUMEMD GPUMEM_REPLAY TRACES_DIR [--runs N]

Starts one gpumemd (host backend, 16 GiB, expandable segments with gpumemd_page_reuse) and
replays every shipped trace through it in a local session (GPUMEM_HEAP=local gpumem-replay
--socket, N runs, default 3). For each trace prints the Grant, ReturnPieces and MovePieces
requests the daemon served per replay (from its /metrics: the count of
gpumem_request_duration_seconds by op, read before and after) and the replay's median ns per
event (wall time, indicative only on a loaded machine).
"""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REUSE = "expandable_segments:True,gpumemd_page_reuse:True"
OPS = ("grant", "return_pieces", "move_pieces")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def op_counts(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    counts = dict.fromkeys(OPS, 0)
    for line in text.splitlines():
        m = re.match(r'^gpumem_request_duration_seconds_count\{([^}]*)\} (\d+)', line)
        op = m and re.search(r'op="([^"]+)"', m.group(1))
        if op and op.group(1) in counts:
            counts[op.group(1)] += int(m.group(2))
    return counts


def main():
    gpumemd, tool, traces_dir = sys.argv[1:4]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 3
    with tempfile.TemporaryDirectory() as tmp:
        sock, port = os.path.join(tmp, "gpu0.sock"), free_port()
        log = open(os.path.join(tmp, "gpumemd.log"), "w")
        d = subprocess.Popen([gpumemd, "--backend", "host", "--capacity", "16G", "--socket", sock,
                              "--metrics-listen", f"127.0.0.1:{port}", "--alloc-conf", REUSE],
                             stdout=log, stderr=log)
        try:
            for _ in range(1000):
                if os.path.exists(sock) or d.poll() is not None:
                    break
                time.sleep(0.01)
            time.sleep(0.2)  # the metrics listener
            print("| trace | events | Grants / replay | ReturnPieces / replay | MovePieces / replay | ns/event |")
            for trace in sorted(glob.glob(os.path.join(traces_dir, "*.csv"))):
                before = op_counts(port)
                out = subprocess.run([tool, "--socket", sock, "--runs", str(runs), trace], check=True,
                                     capture_output=True, text=True, env=dict(os.environ, GPUMEM_HEAP="local"))
                res = json.loads(out.stdout)
                after = op_counts(port)
                per = {op: (after[op] - before[op]) / runs for op in OPS}
                print(f"| {os.path.basename(trace)} | {res['events']:,} | {per['grant']:,.0f} | "
                      f"{per['return_pieces']:,.0f} | {per['move_pieces']:,.0f} | {res['ns_per_op']:,.0f} |",
                      flush=True)
        finally:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=60)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Statistics that add up after a storm of exits and kills (tests/integration/stats.cmake).

  stats_storm.py GPUMEMD GPUMEMCTL CLIENT HEAP

A real gpumemd (host backend) and rounds of real clients (CLIENT:
gm-test-client, tests/integration/test_client_tool.c) in heap mode HEAP
(local or central), of two tenants where the test runs as root (setpriv to
two uids), else of one. Each client allocates and keeps or caches blocks;
then some are killed with SIGKILL, some exit with live blocks, some free
everything. At every step, for the device, every tenant and every live
process: every statistic has allocated = freed + current, and the small and
large pools add up to "all" (current, allocated and freed). After the storm
nothing is current and the device allocated exactly what it freed.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check_sum(stats, what):
    """allocated = freed + current for every stat; pools add up to all."""
    for key, value in stats.items():
        if not key.endswith(".current"):
            continue
        base = key[: -len(".current")]
        allocated, freed = stats[base + ".allocated"], stats[base + ".freed"]
        if allocated != freed + value:
            fail(f"{what}: {base}: allocated {allocated} != freed {freed} + current {value}")
        if stats[base + ".peak"] < value:
            fail(f"{what}: {base}: peak {stats[base + '.peak']} below current {value}")
        if base.endswith(".all"):
            family = base[: -len(".all")]
            for field in ("current", "allocated", "freed"):
                parts = [stats[f"{family}.{pool}.{field}"] for pool in ("small_pool", "large_pool")]
                if sum(parts) != stats[f"{base}.{field}"]:
                    fail(f"{what}: {family}: small_pool + large_pool {field} {parts} != all {stats[base + '.' + field]}")


class Daemon:
    def __init__(self, gpumemd, gpumemctl, work):
        self.ctl = gpumemctl
        self.seen = set()
        self.sock = os.path.join(work, "gpu0.sock")
        self.log = open(os.path.join(work, "daemon.log"), "w")
        self.proc = subprocess.Popen([gpumemd, "--backend", "host", "--capacity", "2G", "--socket", self.sock,
                                      "--config", "/dev/null", "--metrics-listen", "none"],
                                     stderr=self.log)
        for _ in range(200):
            if os.path.exists(self.sock):
                break
            time.sleep(0.05)
        else:
            fail("the daemon did not create its socket")

    def stats(self, *args):
        out = subprocess.run([self.ctl, "-s", self.sock, "stats", "--json", *args], capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"gpumemctl stats {' '.join(args)}: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def tenants(self):
        out = subprocess.run([self.ctl, "-s", self.sock, "quota", "list", "--json"], capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"gpumemctl quota list: {out.stderr.strip()}")
        doc = json.loads(out.stdout)
        rows = doc["tenants"] if isinstance(doc, dict) else doc
        return [row["tenant"] for row in rows]

    def check_all(self, live, what):
        check_sum(self.stats(), f"{what}: device")
        for tenant in self.tenants():
            self.seen.add(tenant)
            check_sum(self.stats("--tenant", tenant), f"{what}: tenant {tenant}")
        for client in live:
            check_sum(self.stats("--pid", str(client.proc.pid)), f"{what}: pid {client.proc.pid}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Client:
    def __init__(self, binary, sock, mode, a, b, env, prefix):
        self.mode = mode
        self.proc = subprocess.Popen(prefix + [binary, sock, mode, str(a), str(b)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        if mode != "try":
            line = self.proc.stdout.readline()
            if not line.startswith("ready"):
                fail(f"client {mode} {a} {b}: no ready line ({line!r})")


def main():
    gpumemd, gpumemctl, client_bin, heap = sys.argv[1:5]
    work = tempfile.mkdtemp(prefix="gm-stats-storm-")
    os.chmod(work, 0o755)  # the other tenants' uids connect too
    env = dict(os.environ, GPUMEM_HEAP=heap)
    env.pop("GPUMEM_SOCKET", None)
    prefixes = [[]]
    if os.getuid() == 0 and shutil.which("setpriv"):
        prefixes = [["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] for uid in (64101, 64102)]
    rng = random.Random(24)
    daemon = Daemon(gpumemd, gpumemctl, work)
    try:
        for rnd in range(4):
            live = []
            for i in range(10):
                prefix = prefixes[i % len(prefixes)]
                kind = rng.choice(["blocks", "cache", "try"])
                if kind == "blocks":
                    c = Client(client_bin, daemon.sock, "blocks", rng.randint(4, 24), 0, env, prefix)
                elif kind == "cache":
                    c = Client(client_bin, daemon.sock, "cache", rng.choice([MiB, 3 * MiB, 21 * MiB]),
                               rng.randint(1, 4), env, prefix)
                else:  # keeps its blocks and exits without freeing them
                    c = Client(client_bin, daemon.sock, "try", rng.choice([512, 64 << 10, 5 * MiB]),
                               rng.randint(1, 6), env, prefix)
                live.append(c)
            for c in [c for c in live if c.mode == "try"]:
                c.proc.wait(timeout=60)
            live = [c for c in live if c.mode != "try"]
            daemon.check_all(live, f"round {rnd}, clients live")
            for c in live:
                if rng.random() < 0.5:
                    c.proc.send_signal(signal.SIGKILL)
                else:
                    c.proc.stdin.close()  # frees everything, exits
            for c in live:
                c.proc.wait(timeout=60)
            daemon.check_all([], f"round {rnd}, after exits and kills")
        # Every session's end reaches the figures (disconnects are asynchronous).
        for _ in range(200):
            dev = daemon.stats()
            if dev["allocated_bytes.all.current"] == 0 and dev["reserved_bytes.all.current"] == 0:
                break
            time.sleep(0.05)
        daemon.check_all([], "after the storm")
        dev = daemon.stats()
        for key, value in dev.items():
            if key.endswith(".current") and not key.startswith("oversize") and value != 0:
                fail(f"after the storm: {key} = {value}")
        if dev["allocation.all.allocated"] == 0:
            fail("the storm allocated nothing")
        if len(daemon.seen) < len(prefixes):
            fail(f"tenants {sorted(daemon.seen)}: not one per client uid")
        print(f"stats storm ({heap} heaps): {dev['allocation.all.allocated']} blocks allocated and freed, "
              f"{dev['segment.all.allocated']} segments, tenants {', '.join(sorted(daemon.seen))}; every figure adds up")
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

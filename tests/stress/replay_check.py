#!/usr/bin/env python3
"""Functional test of gpumem-replay (not timed).

Usage: replay_check.py GPUMEM_REPLAY TRACES_DIR [GPUMEMD]

Replays every shipped trace in process with native and expandable segments
and with page reuse (heap check every 1000 events) and checks the exit status,
the JSON keys and peak_reserved >= peak_allocated >= peak_requested; checks
the hand-derived figures of the fragmentation trace (peaks and page moves),
that page reuse never reserves more than plain expandable segments on a
shipped trace and reports its moves, that malformed traces exit 2 naming the
line, and, given GPUMEMD, that replay through a daemon session reproduces the
in-process peaks exactly: plain, and with page reuse in central and local heaps.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
KEYS = ("trace", "events", "allocs", "peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
        "fragmentation", "num_alloc_retries", "num_ooms", "ns_per_op", "alloc_conf", "page_reuse", "violations")
REUSE = "expandable_segments:True,gpumemd_page_reuse:True"
MODES = ("", "expandable_segments:True", REUSE)
REUSE_KEYS = ("active", "pages_moved", "ranges_moved", "allocs_with_moves", "moves_per_1k_allocs", "refused_busy",
              "remap_failures", "moving_alloc_ns", "other_alloc_ns", "moving_allocs_ns_total")
# frag_16m_32m.csv: 8 x 16 MiB, 4 freed, then 4 x 32 MiB; peak requested 4*16 + 4*32 = 192 MiB.
# Native: every request >= 10 MiB gets its own segment (16 MiB holes never fit 32 MiB) = 8*16 + 4*32.
# Expandable: one segment mapped in 20 MiB pages; 128 MiB of 16 MiB blocks map 140 MiB, the 32 MiB
# requests extend the tail to 8*16 + 4*32 = 256 MiB, rounded up to 13 pages = 260 MiB.
# Page reuse: 2 MiB pages, 128 MiB for the 16 MiB blocks; the first two 32 MiB requests take the
# 4 holes' 32 pages (4 source ranges), the last two map 32 MiB new: 192 MiB.
FRAG = {"": 256 * MIB, "expandable_segments:True": 260 * MIB, REUSE: 192 * MIB}
FRAG_MOVES = {"pages_moved": 32, "ranges_moved": 4, "allocs_with_moves": 2, "refused_busy": 0,
              "remap_failures": 0}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def replay(tool, args, heap=None):
    env = dict(os.environ, GPUMEM_HEAP=heap) if heap else None
    p = subprocess.run([tool] + args, capture_output=True, text=True, timeout=600, env=env)
    return p.returncode, p.stdout, p.stderr


def one_json(out, what):
    lines = out.splitlines()
    if not check(len(lines) == 1, f"{what}: one JSON line expected, got {len(lines)}"):
        return None
    return json.loads(lines[0])


def check_result(res, trace, conf, what):
    for k in KEYS:
        check(k in res, f"{what}: key {k} missing")
    if any(k not in res for k in KEYS):
        return
    req, alc, rsv = res["peak_requested_bytes"], res["peak_allocated_bytes"], res["peak_reserved_bytes"]
    check(res["trace"] == os.path.basename(trace), f"{what}: trace name {res['trace']}")
    check(res["events"] > 0, f"{what}: no events")
    check(0 < req <= alc <= rsv, f"{what}: peaks requested {req} allocated {alc} reserved {rsv}")
    check(abs(res["fragmentation"] - rsv / req) < 1e-3, f"{what}: fragmentation {res['fragmentation']}")
    check(res["violations"] == 0 and res["num_ooms"] == 0, f"{what}: violations or OOMs at 80 GiB")
    check(res["ns_per_op"] > 0, f"{what}: ns_per_op {res['ns_per_op']}")
    check(res["allocs"] * 2 == res["events"], f"{what}: allocs {res['allocs']} of {res['events']} events")
    if conf is not None:
        check(res["alloc_conf"] == conf, f"{what}: alloc_conf {res['alloc_conf']!r}")
    reuse = res["page_reuse"]
    if conf != REUSE:
        check(reuse is None, f"{what}: page_reuse {reuse!r} without the mode")
        return
    if not check(isinstance(reuse, dict) and all(k in reuse for k in REUSE_KEYS), f"{what}: page_reuse {reuse!r}"):
        return
    check(reuse["active"] and reuse["pages_moved"] >= reuse["ranges_moved"] >= reuse["allocs_with_moves"] > 0,
          f"{what}: page moves {reuse}")
    check(abs(reuse["moves_per_1k_allocs"] - 1000 * reuse["pages_moved"] / res["allocs"]) < 0.01,
          f"{what}: moves_per_1k_allocs {reuse['moves_per_1k_allocs']}")
    check(reuse["moving_alloc_ns"] > 0 and reuse["other_alloc_ns"] > 0, f"{what}: allocation times {reuse}")


def start_daemon(gpumemd, tmp, name="gpu0", extra=()):
    sock = os.path.join(tmp, name + ".sock")
    log = open(os.path.join(tmp, name + ".log"), "w")
    d = subprocess.Popen([gpumemd, "--backend", "host", "--capacity", "16G", "--socket", sock,
                          "--metrics-listen", "127.0.0.1:0", *extra], stdout=log, stderr=log)
    for _ in range(1000):  # readiness: the socket file appears (not a timing assertion)
        if os.path.exists(sock) or d.poll() is not None:
            break
        time.sleep(0.01)
    check(d.poll() is None and os.path.exists(sock), "gpumemd did not start")
    return d, sock


def socket_replays(tool, sock, traces, refs, label, heap=None):
    """Replays every trace through the daemon on `sock` (GPUMEM_HEAP=heap) and checks that the
    peaks equal the in-process ones in `refs`; returns the results, each with its "trace" name."""
    results = []
    for trace in traces:
        what = f"{os.path.basename(trace)} [{label}]"
        rc, out, err = replay(tool, ["--socket", sock, trace], heap)
        if not check(rc == 0, f"{what}: exit {rc}: {err.strip()}"):
            continue
        res = one_json(out, what)
        if res is None:
            continue
        check_result(res, trace, None, what)
        ref = refs.get(trace, {})
        for k in ("events", "peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes"):
            check(res.get(k) == ref.get(k), f"{what}: {k} {res.get(k)} != in process {ref.get(k)}")
        results.append(dict(res, trace=os.path.basename(trace)))
    return results


def main():
    tool, traces_dir = sys.argv[1], sys.argv[2]
    gpumemd = sys.argv[3] if len(sys.argv) > 3 else None
    traces = sorted(glob.glob(os.path.join(traces_dir, "*.csv")))
    check(len(traces) >= 4, f"expected at least 4 shipped traces, found {len(traces)}")
    native, expandable, reused = {}, {}, {}
    formats = set()
    for trace in traces:
        for conf in MODES:
            what = f"{os.path.basename(trace)} [{conf or 'native'}]"
            rc, out, err = replay(tool, ["--alloc-conf", conf, "--check", "1000", trace])
            if not check(rc == 0, f"{what}: exit {rc}: {err.strip()}"):
                continue
            res = one_json(out, what)
            if res is None:
                continue
            check_result(res, trace, conf, what)
            formats.add(res.get("format"))
            if conf == "":
                native[trace] = res
            if conf == MODES[1]:
                expandable[trace] = res
            if conf == REUSE:
                reused[trace] = res
            if conf == REUSE and trace in expandable:
                check(res["peak_reserved_bytes"] <= expandable[trace]["peak_reserved_bytes"],
                      f"{what}: page reuse reserves more than expandable segments")
            if os.path.basename(trace) == "frag_16m_32m.csv":
                check(res["peak_requested_bytes"] == 192 * MIB, f"{what}: peak requested")
                check(res["peak_reserved_bytes"] == FRAG[conf], f"{what}: peak reserved {res['peak_reserved_bytes']}")
                if conf == REUSE and isinstance(res.get("page_reuse"), dict):
                    for k, v in FRAG_MOVES.items():
                        check(res["page_reuse"].get(k) == v, f"{what}: {k} {res['page_reuse'].get(k)} != {v}")
    check(formats == {"csv", "rmm"}, f"both formats shipped: {sorted(f for f in formats if f)}")

    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "bad.csv")
        for text, line in (("seq,action,id,size\n0,alloc,1,4096\n1,alloc,2,4x\n", 3),
                           ("seq,action,id,size\n0,alloc,1,4096\n\n0,free,9,4096\n", 4),
                           ("Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,512\n", 2),
                           ("id,size\n1,2\n", 1)):
            with open(bad, "w") as f:
                f.write(text)
            rc, out, err = replay(tool, [bad])
            check(rc == 2 and f"bad.csv:{line}:" in err and out == "",
                  f"malformed trace (line {line}): exit {rc}, stderr {err.strip()!r}")

        if gpumemd:
            d, sock = start_daemon(gpumemd, tmp)
            try:
                socket_replays(tool, sock, traces, native, "socket")
            finally:
                d.send_signal(signal.SIGTERM)
                check(d.wait(timeout=60) == 0, "gpumemd exit status")
            # Page reuse through a daemon, in both heap modes: the daemon's heap moves pages and the
            # client applies the moves from the allocation reply (central), or the client's own heap
            # moves them and tells the daemon (local). Both reproduce the in-process figures exactly
            # (frag_16m_32m: 192 MiB where plain expandable segments reserve 260 MiB).
            d, sock = start_daemon(gpumemd, tmp, "reuse", ("--alloc-conf", REUSE))
            try:
                for heap in ("central", "local"):
                    for res in socket_replays(tool, sock, traces, reused, f"socket, {heap} heap, {REUSE}", heap):
                        if res["trace"] == "frag_16m_32m.csv":
                            check(res["peak_reserved_bytes"] == FRAG[REUSE],
                                  f"frag_16m_32m.csv [{heap} heap]: peak reserved {res['peak_reserved_bytes']}")
            finally:
                d.send_signal(signal.SIGTERM)
                check(d.wait(timeout=60) == 0, "gpumemd (page reuse) exit status")
    if failures:
        sys.exit(1)
    print(f"ok: {len(traces)} traces, native, expandable and page reuse" + (", and through gpumemd" if gpumemd else ""))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Functional test of gpumem-replay (not timed).

Usage: replay_check.py GPUMEM_REPLAY TRACES_DIR [GPUMEMD]

Replays every shipped trace in process with native and expandable segments
(heap check every 1000 events) and checks the exit status, the JSON keys and
peak_reserved >= peak_allocated >= peak_requested; checks the hand-derived
figures of the fragmentation trace, that malformed traces exit 2 naming the
line, and, given GPUMEMD, that replay through a daemon session reproduces the
in-process peaks exactly.
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
KEYS = ("trace", "events", "peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
        "fragmentation", "num_alloc_retries", "num_ooms", "ns_per_op", "alloc_conf", "violations")
MODES = ("", "expandable_segments:True")
# frag_16m_32m.csv: 8 x 16 MiB, 4 freed, then 4 x 32 MiB; peak requested 4*16 + 4*32 = 192 MiB.
# Native: every request >= 10 MiB gets its own segment (16 MiB holes never fit 32 MiB) = 8*16 + 4*32.
# Expandable: one segment mapped in 20 MiB pages; 128 MiB of 16 MiB blocks map 140 MiB, the 32 MiB
# requests extend the tail to 8*16 + 4*32 = 256 MiB, rounded up to 13 pages = 260 MiB.
FRAG = {"": 256 * MIB, "expandable_segments:True": 260 * MIB}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def replay(tool, args):
    p = subprocess.run([tool] + args, capture_output=True, text=True, timeout=600)
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
    if conf is not None:
        check(res["alloc_conf"] == conf, f"{what}: alloc_conf {res['alloc_conf']!r}")


def start_daemon(gpumemd, tmp):
    sock = os.path.join(tmp, "gpu0.sock")
    log = open(os.path.join(tmp, "gpumemd.log"), "w")
    d = subprocess.Popen([gpumemd, "--backend", "host", "--capacity", "16G", "--socket", sock,
                          "--metrics-listen", "127.0.0.1:0"], stdout=log, stderr=log)
    for _ in range(1000):  # readiness: the socket file appears (not a timing assertion)
        if os.path.exists(sock) or d.poll() is not None:
            break
        time.sleep(0.01)
    check(d.poll() is None and os.path.exists(sock), "gpumemd did not start")
    return d, sock


def main():
    tool, traces_dir = sys.argv[1], sys.argv[2]
    gpumemd = sys.argv[3] if len(sys.argv) > 3 else None
    traces = sorted(glob.glob(os.path.join(traces_dir, "*.csv")))
    check(len(traces) >= 4, f"expected at least 4 shipped traces, found {len(traces)}")
    native = {}
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
            if os.path.basename(trace) == "frag_16m_32m.csv":
                check(res["peak_requested_bytes"] == 192 * MIB, f"{what}: peak requested")
                check(res["peak_reserved_bytes"] == FRAG[conf], f"{what}: peak reserved {res['peak_reserved_bytes']}")
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
                for trace in traces:
                    what = f"{os.path.basename(trace)} [socket]"
                    rc, out, err = replay(tool, ["--socket", sock, trace])
                    if not check(rc == 0, f"{what}: exit {rc}: {err.strip()}"):
                        continue
                    res = one_json(out, what)
                    if res is None:
                        continue
                    check_result(res, trace, None, what)
                    ref = native.get(trace, {})
                    for k in ("events", "peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes"):
                        check(res.get(k) == ref.get(k), f"{what}: {k} {res.get(k)} != in process {ref.get(k)}")
            finally:
                d.send_signal(signal.SIGTERM)
                check(d.wait(timeout=60) == 0, "gpumemd exit status")
    if failures:
        sys.exit(1)
    print(f"ok: {len(traces)} traces, native and expandable" + (", and through gpumemd" if gpumemd else ""))


if __name__ == "__main__":
    main()

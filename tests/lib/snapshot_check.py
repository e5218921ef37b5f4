#!/usr/bin/env python3
"""Checks a gpumemd memory snapshot (pickle or JSON) against PyTorch's 2.x
torch.cuda.memory._snapshot() schema and what the viewers need.

Usage: snapshot_check.py FILE [--device N] [--segments N] [--states S,S..]
                              [--actions A,A..] [--expandable] [--same-as FILE2]
                              [--categories] [--legacy]
--categories: blocks and trace entries carry the `category` MemoryViz.js
colours by, with "unknown" among the trace's (the viewer throws without it).
--legacy: PyTorch 1.13's format, a bare list of segments; when a Python with
PyTorch 1.x is found (this one or /usr/bin/python3), its
torch.cuda._memory_viz `stats` and `segments` must read it too.
Prints nothing and exits 0 when the file is valid; otherwise prints the
problems to stderr and exits 1.
"""
import argparse
import json
import pickle
import pickletools
import subprocess
import sys

# Opcodes the unpickler in torch/utils/viz/MemoryViz.js understands.
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT",
    "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "APPEND", "APPENDS",
    "SETITEM", "SETITEMS", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1",
    "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc",
           "segment_free", "segment_map", "segment_unmap", "snapshot", "oom"}
SEGMENT_KEYS = {"device": int, "address": int, "total_size": int,
                "allocated_size": int, "active_size": int,
                "requested_size": int, "stream": int, "segment_type": str,
                "is_expandable": bool, "frames": list, "blocks": list,
                "pid": int, "tenant": str, "session_id": int}
BLOCK_KEYS = {"address": int, "size": int, "requested_size": int,
              "state": str, "frames": list}
SETTINGS_KEYS = {"PYTORCH_CUDA_ALLOC_CONF": str, "max_split_size": int,
                 "garbage_collection_threshold": float,
                 "expandable_segments": bool,
                 "release_lock_on_cudamalloc": bool,
                 "pinned_use_cuda_host_register": bool,
                 "pinned_num_register_threads": int,
                 "roundup_power2_divisions": dict}
MAX_EXACT = 1 << 53  # JavaScript numbers are exact below this


class Checker:
    def __init__(self):
        self.errors = []

    def fail(self, msg):
        self.errors.append(msg)

    def typed(self, where, d, keys):
        """Every key present with its type (bool is not an int here)."""
        if not isinstance(d, dict):
            self.fail(f"{where}: not a dict")
            return False
        ok = True
        for k, t in keys.items():
            v = d.get(k)
            if v is None or type(v) is not t:
                self.fail(f"{where}: key {k!r} missing or not {t.__name__}: {v!r}")
                ok = False
            elif t is int and not -MAX_EXACT < v < MAX_EXACT:
                self.fail(f"{where}: {k}={v} not exact in JavaScript")
        return ok


def load(path, c):
    data = open(path, "rb").read()
    if data[:1] == b"\x80":
        proto = None
        for op, arg, pos in pickletools.genops(data):
            if op.name not in VIEWER_OPCODES:
                c.fail(f"pickle opcode {op.name} at {pos} is not readable by MemoryViz.js")
            if op.name == "PROTO":
                proto = arg
            elif proto is not None and op.proto > proto:
                c.fail(f"pickle opcode {op.name} at {pos} needs protocol {op.proto} > {proto}")
        if proto is None or not 2 <= proto <= 4:
            c.fail(f"pickle protocol {proto} outside 2..4")
        return pickle.loads(data), True

    def no_constants(name):
        raise ValueError(f"JSON constant {name} is not valid JSON")
    return json.loads(data.decode("utf-8"), parse_constant=no_constants), False


def check_segments(c, segments, is_pickle, device):
    prev_end = None
    for i, s in enumerate(segments):
        where = f"segments[{i}]"
        if not c.typed(where, s, SEGMENT_KEYS):
            continue
        pool = s.get("segment_pool_id")
        if type(pool) is not (tuple if is_pickle else list) or len(pool) != 2 \
                or any(type(x) is not int for x in pool):
            c.fail(f"{where}: segment_pool_id {pool!r} is not a 2-tuple of ints")
        if s["segment_type"] not in ("small", "large"):
            c.fail(f"{where}: segment_type {s['segment_type']!r}")
        if device is not None and s["device"] != device:
            c.fail(f"{where}: device {s['device']} != {device}")
        if prev_end is not None and s["address"] < prev_end:
            c.fail(f"{where}: address {s['address']:#x} overlaps or is out of order (previous end {prev_end:#x})")
        prev_end = s["address"] + s["total_size"]
        if not s["blocks"]:
            c.fail(f"{where}: no blocks")
        addr = s["address"]
        sums = {"total": 0, "allocated": 0, "active": 0, "requested": 0}
        for j, b in enumerate(s["blocks"]):
            bw = f"{where}.blocks[{j}]"
            if not c.typed(bw, b, BLOCK_KEYS):
                continue
            if b["state"] not in STATES:
                c.fail(f"{bw}: state {b['state']!r}")
            if b["address"] != addr:
                c.fail(f"{bw}: address {b['address']:#x}, running sum gives {addr:#x}")
            if b["size"] <= 0:
                c.fail(f"{bw}: size {b['size']}")
            addr += b["size"]
            sums["total"] += b["size"]
            if b["state"] == "active_allocated":
                sums["allocated"] += b["size"]
            if b["state"] != "inactive":
                sums["active"] += b["size"]
                sums["requested"] += b["requested_size"]
                if not 0 < b["requested_size"] <= b["size"]:
                    c.fail(f"{bw}: requested_size {b['requested_size']} outside (0, size]")
        for k, v in sums.items():
            if s[f"{k}_size"] != v:
                c.fail(f"{where}: {k}_size {s[f'{k}_size']} != sum over blocks {v}")


def check_traces(c, snap, device):
    traces = snap.get("device_traces")
    if type(traces) is not list or any(type(t) is not list for t in traces):
        c.fail("device_traces is not a list of lists")
        return []
    if device is not None and len(traces) != device + 1:
        c.fail(f"device_traces has {len(traces)} lists, expected {device + 1}")
    if device is not None and any(traces[:device]):
        c.fail("device_traces: entries for another device")
    entries = traces[-1] if traces else []
    for i, e in enumerate(entries):
        where = f"device_traces[-1][{i}]"
        if not c.typed(where, e, {"action": str, "size": int, "stream": int, "time_us": int, "pid": int}):
            continue
        if e["action"] not in ACTIONS:
            c.fail(f"{where}: action {e['action']!r}")
        key, other = ("device_free", "addr") if e["action"] == "oom" else ("addr", "device_free")
        if type(e.get(key)) is not int or other in e:
            c.fail(f"{where}: {e['action']} needs {key!r} and no {other!r}")
        if "frames" in e:
            if type(e["frames"]) is not list or not e["frames"]:
                c.fail(f"{where}: frames present but not a non-empty list")
            else:
                for f in e["frames"]:
                    c.typed(f"{where}.frames", f, {"filename": str, "line": int, "name": str})
    return entries


def check_replay(c, segments, entries, device):
    """Replays the trace backwards from the snapshot's state, as MemoryViz.js's
    segment view does, and fails where the viewer would break: a
    free_requested with no block at its address, a segment_alloc with no
    segment starting at its address, a segment_map outside every segment, or
    a block outside every segment."""
    segs = sorted([s["address"], s["total_size"], s["stream"]] for s in segments
                  if device is None or s["device"] == device)
    blocks = {}
    for s in segments:
        if device is None or s["device"] == device:
            for b in s["blocks"]:
                if b["state"] != "inactive":
                    blocks[b["address"]] = b["size"]

    def containing(addr, size):
        for seg in segs:
            if seg[0] <= addr and addr + size <= seg[0] + seg[1]:
                return seg
        return None

    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        action, addr, size = e["action"], e.get("addr"), e["size"]
        where = f"trace replay at entry {i} ({action} {addr})"
        if action in ("free_requested",) and addr not in blocks:
            c.fail(f"{where}: no block at this address")
        elif action == "free_completed":
            blocks[addr] = size
        elif action == "alloc":
            blocks.pop(addr, None)
        elif action == "segment_free":
            segs.append([addr, size, e["stream"]])
            segs.sort()
        elif action == "segment_unmap":
            segs.append([addr, size, e["stream"]])
            segs.sort()
            merged = []
            for seg in segs:
                if merged and merged[-1][0] + merged[-1][1] == seg[0] and merged[-1][2] == seg[2]:
                    merged[-1][1] += seg[1]
                else:
                    merged.append(seg)
            segs[:] = merged
        elif action == "segment_alloc":
            hit = [seg for seg in segs if seg[0] == addr]
            if not hit:
                c.fail(f"{where}: no segment starts here")
            else:
                segs.remove(hit[0])
        elif action == "segment_map":
            seg = containing(addr, size)
            if seg is None:
                c.fail(f"{where}: range is inside no segment")
                continue
            segs.remove(seg)
            if seg[0] < addr:
                segs.append([seg[0], addr - seg[0], seg[2]])
            if addr + size < seg[0] + seg[1]:
                segs.append([addr + size, seg[0] + seg[1] - addr - size, seg[2]])
            segs.sort()
        for baddr, bsize in blocks.items():
            if containing(baddr, bsize) is None:
                c.fail(f"{where}: block {baddr:#x} (+{bsize}) lies in no segment")
                return


def check_settings(c, snap):
    st = snap.get("allocator_settings")
    if not c.typed("allocator_settings", st, SETTINGS_KEYS):
        return
    rd = st["roundup_power2_divisions"]
    if sorted(rd) != sorted(str(1 << i) for i in range(16)) or any(type(v) is not int for v in rd.values()):
        c.fail(f"allocator_settings.roundup_power2_divisions: {rd!r}")
    if st["max_split_size"] < -1:
        c.fail(f"allocator_settings.max_split_size {st['max_split_size']}")


LEGACY_SEGMENT_KEYS = {"device": int, "address": int, "total_size": int,
                       "allocated_size": int, "active_size": int, "stream": int,
                       "segment_type": str, "blocks": list}
MEMORY_VIZ_1X = """
import pickle, sys
import torch
from torch.cuda import _memory_viz as mv
if not torch.__version__.startswith("1."):
    sys.exit(3)
snap = pickle.load(open(sys.argv[1], "rb"))
mv.stats(snap)
text = mv.segments(snap, format_flamegraph=lambda lines: lines)
if snap and not text:
    sys.exit(2)
"""


def check_legacy(c, path, segments):
    """PyTorch 1.13: segments with blocks {size, state, history?}."""
    for i, s in enumerate(segments):
        where = f"segments[{i}]"
        if not c.typed(where, s, LEGACY_SEGMENT_KEYS):
            continue
        total = allocated = active = 0
        for j, b in enumerate(s["blocks"]):
            bw = f"{where}.blocks[{j}]"
            if not c.typed(bw, b, {"size": int, "state": str}) or b["state"] not in STATES:
                c.fail(f"{bw}: bad block {b!r}")
                continue
            total += b["size"]
            allocated += b["size"] if b["state"] == "active_allocated" else 0
            active += b["size"] if b["state"] != "inactive" else 0
            for h in b.get("history", []):
                c.typed(f"{bw}.history", h, {"addr": int, "real_size": int, "frames": list})
        if (total, allocated, active) != (s["total_size"], s["allocated_size"], s["active_size"]):
            c.fail(f"{where}: sizes do not add up")
    if c.errors:
        return
    for py in (sys.executable, "/usr/bin/python3"):
        try:
            r = subprocess.run([py, "-c", MEMORY_VIZ_1X, path], capture_output=True, text=True, timeout=120)
        except OSError:
            continue
        if r.returncode == 0:
            return
        if "No module named 'torch'" in r.stderr or r.returncode == 3:
            continue
        c.fail(f"torch.cuda._memory_viz ({py}) cannot read it: {r.stderr.strip()[-400:]}")
        return


def check_categories(c, segments, entries):
    for i, s in enumerate(segments):
        for j, b in enumerate(s.get("blocks", [])):
            if b.get("state") != "inactive" and type(b.get("category")) is not str:
                c.fail(f"segments[{i}].blocks[{j}]: no category")
    cats = set()
    for i, e in enumerate(entries):
        if type(e.get("category")) is not str:
            c.fail(f"device_traces[-1][{i}]: no category")
        else:
            cats.add(e["category"])
    if cats and "unknown" not in cats:
        c.fail("trace categories lack 'unknown' (MemoryViz.js throws)")


def as_lists(v):
    """The JSON view of a value: tuples become lists."""
    if isinstance(v, (list, tuple)):
        return [as_lists(x) for x in v]
    if isinstance(v, dict):
        return {k: as_lists(x) for k, x in v.items()}
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--device", type=int)
    ap.add_argument("--segments", type=int, help="exact number of segments")
    ap.add_argument("--states", help="block states that must all appear")
    ap.add_argument("--actions", help="the exact sequence of trace actions")
    ap.add_argument("--expandable", action="store_true", help="an expandable segment must appear")
    ap.add_argument("--same-as", help="another snapshot (e.g. the other format) that must hold the same tree")
    ap.add_argument("--categories", action="store_true", help="blocks and trace entries carry categories")
    ap.add_argument("--legacy", action="store_true", help="PyTorch 1.13's bare list of segments")
    args = ap.parse_args()

    c = Checker()
    try:
        snap, is_pickle = load(args.file, c)
    except Exception as exc:  # any load failure is a verdict, not a crash
        print(f"{args.file}: does not load: {exc!r}", file=sys.stderr)
        return 1
    if args.legacy:
        if type(snap) is not list:
            c.fail(f"top level is {type(snap).__name__}, not list")
        else:
            check_legacy(c, args.file, snap)
            if args.segments is not None and len(snap) != args.segments:
                c.fail(f"{len(snap)} segments, expected {args.segments}")
    elif type(snap) is not dict:
        c.fail(f"top level is {type(snap).__name__}, not dict")
    else:
        segments = snap.get("segments")
        if type(segments) is not list:
            c.fail("segments is not a list")
            segments = []
        if snap.get("external_annotations") != []:
            c.fail("external_annotations is not an empty list")
        check_segments(c, segments, is_pickle, args.device)
        entries = check_traces(c, snap, args.device)
        if not c.errors:
            check_replay(c, segments, entries, args.device)
        check_settings(c, snap)
        if args.segments is not None and len(segments) != args.segments:
            c.fail(f"{len(segments)} segments, expected {args.segments}")
        seen = {b.get("state") for s in segments for b in s.get("blocks", [])}
        for st in filter(None, (args.states or "").split(",")):
            if st not in seen:
                c.fail(f"no block in state {st}")
        if args.actions is not None:
            got = ",".join(str(e.get("action")) for e in entries)
            if got != args.actions:
                c.fail(f"trace actions {got}, expected {args.actions}")
        if args.categories:
            check_categories(c, segments, entries)
        if args.expandable and not any(s.get("is_expandable") is True for s in segments):
            c.fail("no expandable segment")
        if args.same_as:
            other, _ = load(args.same_as, c)
            if as_lists(other) != as_lists(snap):
                c.fail(f"the tree differs from {args.same_as}")
    for msg in c.errors:
        print(f"{args.file}: {msg}", file=sys.stderr)
    return 1 if c.errors else 0


if __name__ == "__main__":
    sys.exit(main())

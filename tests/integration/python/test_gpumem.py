"""The gpumem package against real daemons: every function's figures are the
ones gpumemctl reads from the same daemon at the same moment."""
import ctypes
import errno
import os
import pickle
import subprocess
import sys
import time

import pytest

from conftest import CAPACITY

MiB = 1 << 20
META_KEYS = {"device", "backend", "capacity_bytes", "sessions", "tenant", "claimed_bytes"}


class Blocks:
    """Allocations through the PyTorch entry points, as PyTorch makes them."""

    def __init__(self, gpumem, device=0, stream=None):
        self.lib = gpumem._lib.torch_lib
        self.device = device
        self.stream = stream
        self.held = []

    def alloc(self, size):
        ptr = self.lib.gpumem_torch_alloc(size, self.device, self.stream)
        assert ptr, f"allocation of {size} refused"
        ctypes.memset(ptr, 0x5A, size)  # host backend: CPU memory, all of it writable
        self.held.append((ptr, size))
        return ptr

    def free_all(self):
        while self.held:
            ptr, size = self.held.pop()
            self.lib.gpumem_torch_free(ptr, size, self.device, self.stream)


@pytest.fixture
def blocks(gpumem):
    made = []

    def make(device=0, stream=None):
        b = Blocks(gpumem, device, stream)
        made.append(b)
        return b
    yield make
    for b in made:
        b.free_all()


def ctl_stats(daemons, device, *args):
    return {k: v for k, v in daemons.ctl_json(device, "stats", "--json", *args).items() if k not in META_KEYS}


def test_memory_stats_match_gpumemctl(gpumem, daemons, blocks):
    b = blocks()
    for size in (512, 100_000, 3 * MiB, 12 * MiB):
        b.alloc(size)
    pid = str(os.getpid())
    session = gpumem.memory_stats()
    assert list(session) == sorted(session)  # flat and sorted, as torch.cuda.memory_stats()
    assert session == ctl_stats(daemons, 0, "--pid", pid)
    assert session["requested_bytes.all.current"] == 512 + 100_000 + 15 * MiB
    assert gpumem.memory_stats(0, scope="pid", pid=os.getpid()) == session
    assert gpumem.memory_stats("cuda:0", scope="device") == ctl_stats(daemons, 0)
    assert gpumem.memory_stats(scope="tenant") == ctl_stats(daemons, 0, "--tenant", "uid:0")
    assert gpumem.memory_allocated() == session["allocated_bytes.all.current"] > 0
    assert gpumem.memory_reserved() == session["reserved_bytes.all.current"] >= gpumem.memory_allocated()
    assert gpumem.max_memory_allocated() == session["allocated_bytes.all.peak"]
    assert gpumem.max_memory_reserved() == session["reserved_bytes.all.peak"]
    nested = gpumem.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == session["allocated_bytes.all.current"]
    assert nested["num_ooms"] == session["num_ooms"]


def test_devices_are_separate_daemons(gpumem, daemons, blocks):
    before = gpumem.memory_allocated(0)
    b1 = blocks(device=1)
    b1.alloc(5 * MiB)
    assert gpumem.memory_stats(1)["requested_bytes.all.current"] == 5 * MiB
    assert ctl_stats(daemons, 1, "--pid", str(os.getpid()))["requested_bytes.all.current"] == 5 * MiB
    assert gpumem.memory_allocated(0) == before
    b1.free_all()
    assert gpumem.memory_allocated("cuda:1") == 0
    with pytest.raises(ValueError):
        gpumem.memory_stats("cpu")
    with pytest.raises(ValueError):
        gpumem.memory_stats(64)


def test_memory_summary_is_gpumemctl_text(gpumem, daemons, blocks):
    blocks().alloc(7 * MiB)
    text = gpumem.memory_summary(0, scope="device")
    assert text == daemons.ctl(0, "stats")
    assert gpumem.memory_summary() == daemons.ctl(0, "stats", "--pid", str(os.getpid()))
    lines = text.splitlines()
    assert all(len(line) == 77 and line[0] == line[-1] == "|" for line in lines)
    assert "PyTorch CUDA memory summary, device ID 0" in text
    assert len(gpumem.memory_summary(abbreviated=True).splitlines()) < len(lines)
    assert "device ID 1" in gpumem.memory_summary(1)


def test_reset_peak_and_accumulated(gpumem, daemons, blocks):
    b = blocks()
    b.alloc(30 * MiB)
    b.free_all()
    b.alloc(1 * MiB)
    stats = gpumem.memory_stats()
    assert stats["allocated_bytes.all.peak"] > stats["allocated_bytes.all.current"]
    gpumem.reset_peak_memory_stats()
    after = ctl_stats(daemons, 0, "--pid", str(os.getpid()))
    assert after["allocated_bytes.all.peak"] == after["allocated_bytes.all.current"] == gpumem.max_memory_allocated()
    assert gpumem.memory_stats()["allocation.all.allocated"] > 0
    gpumem.reset_accumulated_memory_stats()
    stats = gpumem.memory_stats()
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] == 0
    assert stats["allocation.all.current"] == 1
    with pytest.raises(ValueError):
        gpumem.reset_peak_memory_stats(scope="pid")


def test_empty_cache_and_trim(gpumem, daemons, blocks):
    b = blocks()
    b.alloc(24 * MiB)
    b.free_all()
    assert gpumem.memory_allocated() == 0
    cached = gpumem.memory_reserved()
    assert cached >= 24 * MiB
    gpumem.empty_cache()
    assert gpumem.memory_reserved() == 0
    assert ctl_stats(daemons, 0, "--pid", str(os.getpid()))["reserved_bytes.all.current"] == 0
    b.alloc(24 * MiB)
    b.free_all()
    assert gpumem.trim(tenant="*") >= 24 * MiB  # every tenant: admin
    # A local heap gives its cache back from its service thread when the
    # daemon's Reclaim arrives: wait (bounded) until it has, then nothing is left.
    deadline = time.monotonic() + 10
    while gpumem.memory_reserved() != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gpumem.memory_reserved() == 0
    assert gpumem.trim() == 0


def test_mem_get_info(gpumem, daemons, blocks):
    b = blocks()
    b.alloc(40 * MiB)
    free, total = gpumem.mem_get_info()
    device = daemons.ctl_json(0, "stats", "--json")
    assert total == device["capacity_bytes"] == CAPACITY
    assert free == total - device["reserved_bytes.all.current"]
    daemons.ctl(0, "quota", "set", "uid:0", "100M", "--runtime")
    try:
        charged = gpumem.get_quota()["charged_bytes"]
        assert gpumem.mem_get_info() == (100 * MiB - charged, total)
    finally:
        daemons.ctl(0, "quota", "set", "uid:0", "0", "--runtime")


def process_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def settled_clients(gpumem, daemons, wait_s=10):
    """gpumem.list_clients() and `gpumemctl clients --json` (less gpumemctl's
    sessions), taken once neither lists a session of a process that has
    exited: an earlier test's client or gpumemctl ends its session by
    exiting, and the daemon sees that close asynchronously. Past wait_s the
    last pair is returned as it is, for the comparison to judge."""
    deadline = time.monotonic() + wait_s
    while True:
        mine = gpumem.list_clients()
        theirs = [c for c in daemons.ctl_json(0, "clients", "--json")
                  if not (c["control"] and c["name"] == "gpumemctl")]
        if not any(process_gone(c["pid"]) for c in mine + theirs) or time.monotonic() > deadline:
            return mine, theirs
        time.sleep(0.05)


def test_list_clients_matches_gpumemctl(gpumem, daemons, blocks):
    blocks().alloc(6 * MiB)
    mine, theirs = settled_clients(gpumem, daemons)
    keys = set(mine[0])  # gpumemctl may print more
    assert keys <= set(theirs[0])
    assert sorted(mine, key=lambda c: c["session_id"]) == sorted(({k: c[k] for k in keys} for c in theirs),
                                                                 key=lambda c: c["session_id"])
    own = [c for c in mine if c["pid"] == os.getpid()]
    assert len(own) == 1 and own[0]["allocated_bytes"] >= 6 * MiB and not own[0]["control"]
    assert own[0]["tenant"] == "uid:0"


def test_quotas(gpumem, daemons):
    gpumem.set_quota("team-py", 3 << 30, runtime=True)
    try:
        entry = gpumem.get_quota("team-py")
        assert entry["quota"] == 3 << 30 and entry["quota_source"] == "runtime" and entry["sessions"] == 0
        listed = {t["tenant"]: t for t in gpumem.quotas()}
        assert listed["team-py"] == entry
        table = daemons.ctl(0, "quota", "list")
        row = next(line.split() for line in table.splitlines() if line.startswith("team-py"))
        assert row[1:3] == ["3.0G", "runtime"]
        assert gpumem.get_quota()["tenant"] == "uid:0"
    finally:
        gpumem.set_quota("team-py", 0, runtime=True)
    assert gpumem.get_quota("team-py")["quota"] == 0


def test_refusal_is_null_with_diagnosis(gpumem, daemons):
    lib = gpumem._lib.torch_lib
    before = gpumem.last_refusal(1)
    assert lib.gpumem_torch_alloc(1 << 40, 1, None) is None
    refusal = gpumem.last_refusal(1)
    assert refusal.errno == errno.ENOMEM
    assert refusal.count == (before.count if before else 0) + 1
    assert "tried to allocate 1.00 TiB" in refusal.message and str(refusal) == refusal.message
    assert refusal.strerror == "out of device memory"


def test_no_daemon(gpumem, daemons):
    with pytest.raises(gpumem.GpumemError) as info:
        gpumem.memory_stats(5)
    assert info.value.errno == errno.ENODEV and "gpu5.sock" in str(info.value)
    assert gpumem._lib.torch_lib.gpumem_torch_alloc(4096, 5, None) is None
    assert gpumem.last_refusal(5).errno == errno.ENODEV


def allocate_in_a_named_frame(b):
    return b.alloc(3 * MiB)


def test_snapshot_with_python_frames(gpumem, daemons, blocks, tmp_path):
    gpumem._record_memory_history(max_entries=1000)
    try:
        b = blocks()
        allocate_in_a_named_frame(b)
        snap = gpumem._snapshot()
    finally:
        gpumem._record_memory_history(None)
    assert set(snap) >= {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert all(type(s["segment_pool_id"]) is tuple for s in snap["segments"])
    assert snap["segments"] and all(s["pid"] == os.getpid() for s in snap["segments"])
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["size"] == 3 * MiB]
    assert allocs, snap["device_traces"]
    frames = allocs[-1]["frames"]
    names = [f["name"] for f in frames]
    assert names[:3] == ["alloc", "allocate_in_a_named_frame", "test_snapshot_with_python_frames"], names
    assert frames[1]["filename"] == __file__ and frames[1]["line"] > 0
    # The live block shows where it came from, as in PyTorch's segment view.
    framed = [b for s in snap["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated" and b["requested_size"] == 3 * MiB]
    assert len(framed) == 1 and [f["name"] for f in framed[0]["frames"]][:2] == ["alloc", "allocate_in_a_named_frame"]
    assert all(b["frames"] == [] for s in snap["segments"] for b in s["blocks"] if b["state"] == "inactive")
    # The dict as torch.cuda.memory._dump_snapshot() pickles it, and the
    # daemon's own pickle: both pass the 2.x schema and the viewers' checks.
    dumped, raw = tmp_path / "dict.pickle", tmp_path / "raw.pickle"
    with open(dumped, "wb") as f:
        pickle.dump(snap, f)
    gpumem._dump_snapshot(str(raw))
    check = [sys.executable, os.environ["GM_SNAPSHOT_CHECK"], "--device", "0"]
    for path in (dumped, raw):
        out = subprocess.run(check + [str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    assert gpumem.memory_snapshot() == gpumem._snapshot()["segments"]
    # History off: the ring is cleared, and no frames are taken any more.
    blocks().alloc(1 * MiB)
    assert gpumem._snapshot()["device_traces"] == [[]]
    with pytest.raises(ValueError):
        gpumem._record_memory_history("sometimes")


# A process with a session of heap mode `heap` holding 2 MiB: it prints the
# segment counts of its own snapshot and of the device-wide one, then waits
# for a line on stdin before it lets go.
SNAPSHOT_CHILD = (
    "import os, sys, gpumem\n"
    "p = gpumem._lib.torch_lib.gpumem_torch_alloc(2 * 1024 * 1024, 0, None)\n"
    "assert p\n"
    "mine = gpumem._snapshot()['segments']\n"
    "everything = gpumem._snapshot(pid=0)['segments']\n"
    "assert all(s['pid'] == os.getpid() for s in mine)\n"
    "print(len(mine), len(everything), sum(s['pid'] == os.getpid() for s in everything), flush=True)\n"
    "sys.stdin.readline()\n")


def snapshot_child(heap):
    env = dict(os.environ, GPUMEM_HEAP=heap)
    child = subprocess.Popen([sys.executable, "-c", SNAPSHOT_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    line = child.stdout.readline().split()
    return child, [int(v) for v in line]


def test_snapshot_of_everything_as_admin_central(daemons):
    # Central sessions: the device-wide snapshot holds each one's own.
    child, (mine, everything, of_child) = snapshot_child("central")
    child.communicate("go\n", timeout=60)
    assert child.returncode == 0
    assert everything >= mine > 0 and of_child == mine


def test_snapshot_of_everything_as_admin(gpumem, daemons, blocks):
    # A local session's own snapshot comes from its heap; the device-wide one
    # holds the central sessions' segments (a central process's among them).
    blocks().alloc(2 * MiB)
    mine = gpumem._snapshot()
    assert mine["segments"] and all(s["pid"] == os.getpid() for s in mine["segments"])
    child, (theirs, _, _) = snapshot_child("central")
    try:
        everything = gpumem._snapshot(pid=0)
    finally:
        child.communicate("go\n", timeout=60)
    assert child.returncode == 0
    assert sum(s["pid"] == child.pid for s in everything["segments"]) == theirs > 0


def run_as_nobody(code):
    setpriv = "/usr/bin/setpriv"
    if os.geteuid() != 0 or not os.access(setpriv, os.X_OK):
        pytest.skip("needs root and setpriv to run a client as another user")
    return subprocess.run([setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", "--",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=os.environ.copy())


def test_rights_are_the_daemons(daemons):
    out = run_as_nobody(
        "import gpumem\n"
        "print(gpumem.memory_stats()['allocated_bytes.all.current'])\n"
        "print(gpumem.get_quota()['tenant'])\n"
        "try:\n"
        "    gpumem.memory_stats(scope='device')\n"
        "except PermissionError as e:\n"
        "    print('refused:', e)\n"
        # Its own history needs no rights, as PyTorch's is per process.
        "gpumem._record_memory_history(max_entries=1000)\n"
        "p = gpumem._lib.torch_lib.gpumem_torch_alloc(3 * 1024 * 1024, 0, None)\n"
        "assert p\n"
        "traces = gpumem._snapshot()['device_traces'][0]\n"
        "allocs = [e for e in traces if e['action'] == 'alloc' and e['size'] == 3 * 1024 * 1024]\n"
        "print(len(allocs), bool(allocs) and all(e['frames'] for e in allocs))\n"
        "gpumem._record_memory_history(None)\n")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["0", "uid:65534"]
    assert lines[2].startswith("refused:") and "admin" in lines[2]
    assert lines[3] == "1 True", out.stdout


def test_train_script_skips_without_torch(daemons):
    script = os.environ.get("GM_TORCH_TRAIN")
    if not script or not os.path.exists(script):
        pytest.skip("scripts/gpu-check/torch_train.py not present")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    try:
        import torch  # noqa: F401
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[-1].startswith("SKIP"), out.stdout


def test_tagged_pools(gpumem, daemons, blocks):
    b = blocks()
    assert gpumem.current_pool() == ""
    with gpumem.pool("kv_cache") as tag:
        assert tag == "kv_cache" and gpumem.current_pool() == "kv_cache"
        b.alloc(12 * MiB)
        with gpumem.pool("weights"):
            b.alloc(3 * MiB)
        assert gpumem.current_pool() == "kv_cache"
    assert gpumem.current_pool() == ""
    b.alloc(512)
    with pytest.raises(gpumem.GpumemError) as e:
        with gpumem.pool("not a name"):
            pass
    assert e.value.errno == errno.EINVAL
    own = [c for c in daemons.ctl_json(0, "clients", "--json") if c["pid"] == os.getpid()][0]
    session = gpumem.memory_stats()
    # per-tag statistics: the local heap's, or a central session's from the daemon's heap
    kv, w = gpumem.memory_stats(tag="kv_cache"), gpumem.memory_stats(tag="weights")
    default = gpumem.memory_stats(tag="")
    assert set(kv) == set(session) and kv["allocated_bytes.all.current"] == 12 * MiB
    for key in ("reserved_bytes.all.current", "allocated_bytes.all.current", "active.all.current"):
        assert kv[key] + w[key] + default[key] == session[key]
    assert own["tags"]["kv_cache"] == kv["reserved_bytes.all.current"]
    assert own["tags"]["weights"] == w["reserved_bytes.all.current"]
    assert own["tags"]["kv_cache"] >= 12 * MiB and own["tags"]["weights"] >= 3 * MiB
    assert sum(own["tags"].values()) == session["reserved_bytes.all.current"]


# Sleep and wake (docs/sleep.md) in a local session of its own: a tensor's
# bytes kept across a sleep at the same address, the memory back with the
# daemon meanwhile (gpumemctl shows the session asleep and what it needs).
SLEEP_CHILD = (
    "import ctypes, sys, gpumem\n"
    "lib = gpumem._lib.torch_lib\n"
    "size = 8 * 1024 * 1024\n"
    "p = lib.gpumem_torch_alloc(size, 0, None)\n"
    "assert p\n"
    "ctypes.memset(p, 0x3C, size)\n"
    "released = gpumem.sleep(keep=True)\n"
    "print(released, gpumem.sleeping_bytes(), gpumem.sleeping_pinned_bytes(), flush=True)\n"
    "sys.stdin.readline()\n"
    "try:\n"
    "    gpumem.sleep(tags=['not a tag'])\n"
    "except OSError as e:\n"
    "    print('tags:', e.errno, flush=True)\n"
    "gpumem.wake(timeout=5)\n"
    "print(gpumem.sleeping_bytes(), ctypes.string_at(p, size) == b'\\x3c' * size, flush=True)\n"
    "lib.gpumem_torch_free(p, size, 0, None)\n")


def test_sleep_and_wake_keep_data(daemons):
    env = dict(os.environ, GPUMEM_HEAP="local")
    child = subprocess.Popen([sys.executable, "-c", SLEEP_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        released, needs, pinned = (int(v) for v in child.stdout.readline().split())
        assert needs == released >= 8 * MiB
        assert pinned == 0  # the host backend pins nothing (cuda's pinning: tests/integration/test_sleep.c)
        mine = [c for c in daemons.ctl_json(0, "clients", "--json") if c["pid"] == child.pid]
        assert len(mine) == 1 and mine[0]["asleep"] and mine[0]["sleeping_bytes"] == needs
        assert mine[0]["reserved_bytes"] == 0
    finally:
        out, _ = child.communicate("go\n", timeout=60)
    assert child.returncode == 0
    assert out.splitlines() == [f"tags: {errno.EINVAL}", "0 True"]


def test_sleep_needs_a_local_session(gpumem, daemons):
    with pytest.raises(TypeError):
        gpumem.sleep(keep="weights")
    out = subprocess.run([sys.executable, "-c",
                          "import gpumem\n"
                          "try:\n"
                          "    gpumem.sleep()\n"
                          "except OSError as e:\n"
                          "    print(e.errno)\n"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, GPUMEM_HEAP="central"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(errno.EOPNOTSUPP)]

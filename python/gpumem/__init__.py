"""gpumem: the gpumemd GPU memory broker from Python, in torch.cuda.memory's names.

    import gpumem.torch
    gpumem.torch.use()                  # PyTorch allocates through gpumemd
    ...
    print(gpumem.memory_summary())      # as torch.cuda.memory_summary()
    gpumem._record_memory_history()     # traces with Python frames
    snap = gpumem._snapshot()           # as torch.cuda.memory._snapshot()
    with gpumem.pool("kv_cache"):       # tagged pools (docs/tags.md)
        kv = torch.empty(n, device="cuda")

Every function works on this process's session with the daemon of a CUDA
device (`device`: None for the current one, an index, "cuda:N" or a
torch.device), the same session the PyTorch allocator uses; it is connected on
first use (see gpumem.h's gpumem_connect_device() for how the daemon is found).
Where the statistics functions take `scope`, "session" (the default, what
torch.cuda.memory reports for a process) can widen to "tenant" (`tenant`: None
for the caller's own), "pid" (`pid`) or "device"; the daemon decides with the
caller's kernel-verified rights, and refuses with PermissionError.

Failures raise GpumemError (an OSError: errno and the daemon's message); an
allocation refused inside PyTorch cannot raise, so its diagnosis is kept for
last_refusal().

Pure Python over libgpumem with ctypes; needs nothing beyond Debian's python3.
"""
import collections
import contextlib
import errno as _errno
import io
import json
import os
import sys
import threading

from . import _lib

__all__ = [
    "GpumemError",
    "Refusal",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "memory_summary",
    "memory_snapshot",
    "empty_cache",
    "mem_get_info",
    "trim",
    "list_clients",
    "quotas",
    "get_quota",
    "set_quota",
    "last_refusal",
    "sleep",
    "wake",
    "sleeping_bytes",
    "sleeping_pinned_bytes",
    "claim",
    "share",
    "open",
    "close",
    "unpublish",
    "pool",
    "current_pool",
]

__version__ = "0.1.0"


class GpumemError(OSError):
    """A refusal of libgpumem or the daemon: errno plus the detailed message."""


_EXCEPTIONS = {_errno.EPERM: PermissionError, _errno.EACCES: PermissionError}


def _raise(err, message, what):
    code = -err
    text = message or _lib.lib.gpumem_strerror(err).decode()
    cls = _EXCEPTIONS.get(code)
    if cls is not None:
        raise cls(code, f"{what}: {text}")
    raise GpumemError(code, f"{what}: {text}")


def _check(r, client, what):
    if r < 0:
        msg = _lib.lib.gpumem_last_error(client)
        _raise(r, msg.decode(errors="replace") if msg else "", what)
    return r


# ---- devices and sessions ----

def _current_device():
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return torch.cuda.current_device()
        except (AttributeError, RuntimeError):
            pass
    return 0


def _is_torch_cuda_device(device):
    """Whether `device` is a torch.cuda.device (the context manager), without importing torch."""
    torch = sys.modules.get("torch")
    cls = getattr(getattr(torch, "cuda", None), "device", None)
    return isinstance(cls, type) and isinstance(device, cls)


def _device_index(device):
    """The process ordinal that `device` names, as torch.cuda's _get_device_index does."""
    if device is None:
        return _current_device()
    if isinstance(device, bool):
        raise TypeError("device must be an int, a 'cuda:N' string or a torch.device")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        kind, _, num = device.partition(":")
        if kind != "cuda" or (num and not num.isdigit()):
            raise ValueError(f"expected a CUDA device ('cuda' or 'cuda:N'), got {device!r}")
        index = int(num) if num else _current_device()
    elif getattr(device, "type", None) == "cuda":  # torch.device
        index = device.index if device.index is not None else _current_device()
    elif _is_torch_cuda_device(device):  # torch.cuda.device(N), as torch/cuda/_utils.py takes it
        index = device.idx
    else:
        raise ValueError(f"expected a CUDA device, got {device!r}")
    if not 0 <= index < _lib.MAX_DEVICES:
        raise ValueError(f"device {index} is outside 0..{_lib.MAX_DEVICES - 1}")
    return index


def _session(device):
    """The libgpumem session of a device (libgpumem_torch's, shared with PyTorch)."""
    index = _device_index(device)
    handle = _lib.c_client_p()
    r = _lib.torch_lib.gpumem_torch_client(index, handle)
    _check(r, None, f"gpumem: cuda:{index}")
    return handle


def _scope_args(scope, tenant, pid):
    if scope not in _lib.SCOPES:
        raise ValueError(f"scope must be one of {sorted(_lib.SCOPES)}, got {scope!r}")
    if tenant is not None and scope != "tenant":
        raise ValueError("tenant= goes with scope='tenant'")
    if scope == "pid" and not pid:
        raise ValueError("scope='pid' needs pid=")
    return _lib.SCOPES[scope], (tenant or "").encode(), int(pid or 0)


# ---- tagged pools ----

@contextlib.contextmanager
def pool(tag, device=None):
    """Allocations this thread makes on the device's session (the one the
    PyTorch allocator uses) inside the block carry `tag` and come from its own
    pool ("" the default; [A-Za-z0-9_.-]{1,31}; nested at most 8 deep, 16
    names per session). See docs/tags.md."""
    client = _session(device)
    _check(_lib.lib.gpumem_pool_begin(client, tag.encode()), client, f"gpumem: pool {tag!r}")
    try:
        yield tag
    finally:
        _check(_lib.lib.gpumem_pool_end(client), client, f"gpumem: pool {tag!r}")


def current_pool(device=None):
    """The tag this thread's allocations on the device's session carry now ("" for none)."""
    return _lib.lib.gpumem_pool_current(_session(device)).decode()


# ---- statistics ----

class _Stats:
    """One set of statistics from the daemon (freed when dropped)."""

    def __init__(self, device, scope, tenant, pid):
        self.client = _session(device)
        code, tenant_b, pid_n = _scope_args(scope, tenant, pid)
        self.handle = _lib.c_stats_p()
        _check(_lib.lib.gpumem_stats_get(self.client, code, tenant_b, pid_n, self.handle), self.client,
               "gpumem: statistics")

    def items(self):
        lib = _lib.lib
        return [(lib.gpumem_stats_name(self.handle, i).decode(), lib.gpumem_stats_value(self.handle, i))
                for i in range(lib.gpumem_stats_count(self.handle))]

    def summary(self, abbreviated):
        text = _lib.ctypes.c_void_p()
        r = _lib.lib.gpumem_stats_summary(self.handle, bool(abbreviated), text)
        if r < 0:
            _raise(r, "", "gpumem: memory_summary")
        try:
            return _lib.ctypes.string_at(text).decode()
        finally:
            _lib.lib.gpumem_buffer_free(text)

    def __del__(self):
        if getattr(self, "handle", None):
            _lib.lib.gpumem_stats_free(self.handle)


def memory_stats(device=None, *, scope="session", tenant=None, pid=None, tag=None):
    """torch.cuda.memory_stats(): every statistic as a flat, sorted dict
    ("allocated_bytes.all.current", ..., "num_ooms", "max_split_size").
    tag= gives one tagged pool's figures of this session (its local heap's,
    or a central session's heap's in the daemon; docs/tags.md): the same
    keys, the num_* counters 0."""
    stats = collections.OrderedDict(sorted(_Stats(device, scope, tenant, pid).items()))
    if tag is None:
        return stats
    if scope != "session":
        raise ValueError("tag= goes with scope='session'")
    client = _session(device)
    value = _lib.ctypes.c_int64()
    for name in stats:
        _check(_lib.lib.gpumem_stat_tag(client, tag.encode(), name.encode(), value), client,
               f"gpumem: pool {tag!r}")
        stats[name] = value.value
    return stats


def memory_stats_as_nested_dict(device=None, *, scope="session", tenant=None, pid=None):
    """torch.cuda.memory_stats_as_nested_dict(): the same keys, split at the dots."""
    nested = {}
    for key, value in memory_stats(device, scope=scope, tenant=tenant, pid=pid).items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def _one(name, device, scope, tenant, pid):
    return memory_stats(device, scope=scope, tenant=tenant, pid=pid).get(name, 0)


def memory_allocated(device=None, *, scope="session", tenant=None, pid=None):
    """torch.cuda.memory_allocated(): bytes held by live allocations."""
    return _one("allocated_bytes.all.current", device, scope, tenant, pid)


def max_memory_allocated(device=None, *, scope="session", tenant=None, pid=None):
    """torch.cuda.max_memory_allocated(): the peak since the last reset."""
    return _one("allocated_bytes.all.peak", device, scope, tenant, pid)


def memory_reserved(device=None, *, scope="session", tenant=None, pid=None):
    """torch.cuda.memory_reserved(): bytes of segments, cached ones included."""
    return _one("reserved_bytes.all.current", device, scope, tenant, pid)


def max_memory_reserved(device=None, *, scope="session", tenant=None, pid=None):
    """torch.cuda.max_memory_reserved()."""
    return _one("reserved_bytes.all.peak", device, scope, tenant, pid)


def _reset(device, scope, tenant, peak, accumulated):
    if scope == "pid":
        raise ValueError("statistics are reset for a session, a tenant or the device")
    client = _session(device)
    code, tenant_b, _ = _scope_args(scope, tenant, None)
    _check(_lib.lib.gpumem_reset_stats(client, code, tenant_b, peak, accumulated), client, "gpumem: reset")


def reset_peak_memory_stats(device=None, *, scope="session", tenant=None):
    """torch.cuda.reset_peak_memory_stats(): every peak becomes the current value."""
    _reset(device, scope, tenant, True, False)


def reset_accumulated_memory_stats(device=None, *, scope="session", tenant=None):
    """torch.cuda.reset_accumulated_memory_stats(): the allocated/freed totals and num_* counters."""
    _reset(device, scope, tenant, False, True)


def memory_summary(device=None, abbreviated=False, *, scope="session", tenant=None, pid=None):
    """torch.cuda.memory_summary(): the table `gpumemctl stats` prints, for this scope."""
    return _Stats(device, scope, tenant, pid).summary(abbreviated)


# ---- caches and capacity ----

def trim(device=None, tenant=None):
    """Releases idle cached memory; returns the bytes given back. `tenant` None is
    this session; a tenant's name, or "*" for all of them, needs admin rights.
    This session's trim raises (EBUSY) while a CUDA graph capture is in progress
    in the process (gpumem_capture_begin(), libgpumem(3))."""
    client = _session(device)
    released = _lib.ctypes.c_uint64()
    if tenant is None:
        r = _lib.lib.gpumem_trim(client, released)
    else:
        r = _lib.lib.gpumem_trim_tenant(client, tenant.encode(), released)
    _check(r, client, "gpumem: trim")
    return released.value


def empty_cache(device=None, *, tenant=None):
    """torch.cuda.empty_cache(): releases this session's idle cached memory (or a
    tenant's, "*" for every tenant, with admin rights)."""
    trim(device, tenant)


def mem_get_info(device=None):
    """torch.cuda.mem_get_info(): (free, total) bytes as gpumemd sees them:
    total is the daemon's capacity, free what this session could still be
    given (the device's unreserved bytes, within the tenant's quota; other
    sessions' claims count as taken, this session's own claim as free)."""
    client = _session(device)
    free, total = _lib.ctypes.c_uint64(), _lib.ctypes.c_uint64()
    _check(_lib.lib.gpumem_mem_get_info(client, free, total), client, "gpumem: mem_get_info")
    return free.value, total.value


# ---- sleep and wake (docs/sleep.md) ----

def _names(names):
    """A NULL-terminated char* array of names, or None."""
    if names is None:
        return None
    encoded = [n.encode() for n in names]
    return (_lib.ctypes.c_char_p * (len(encoded) + 1))(*encoded, None)


def sleep(tags=None, keep=None, *, device=None):
    """Gives this session's physical memory back to the device, keeping every
    address: tensors stay allocated and their pointers valid, but must not be
    touched until wake(). keep: the pools whose tensors' data is copied to
    host memory first (a list of tag names, or True for every one; None:
    none). tags: the pools that sleep (a list of tag names, "" the default;
    None: all); the other pools go on allocating meanwhile, and a daemon
    restart keeps the sleep. Synchronizes the device first, so it raises
    GpumemError (EBUSY) while a CUDA graph capture is in progress in the
    process. Needs a local session (GPUMEM_HEAP=local). Returns the bytes
    given back."""
    if isinstance(keep, str):
        raise TypeError("keep is a list of tag names, or True")
    keep_names = ["*"] if keep is True else (None if keep in (None, False) else list(keep))
    client = _session(device)
    released = _lib.ctypes.c_uint64()
    r = _lib.lib.gpumem_sleep(client, _names(None if tags is None else list(tags)), _names(keep_names), released)
    _check(r, client, "gpumem: sleep")
    return released.value


def wake(timeout=None, *, device=None):
    """Maps memory again at the same addresses and restores the kept data.
    Waits while quota or device is short, up to `timeout` seconds (None: the
    daemon's park_timeout_ms); then raises GpumemError (ENOMEM) with the
    diagnosis, the session still asleep (wake may be called again)."""
    if timeout is not None and not 0 < timeout * 1000 <= 0xFFFFFFFF:
        raise ValueError("timeout is a positive number of seconds")
    client = _session(device)
    ms = 0 if timeout is None else max(1, int(timeout * 1000))
    _check(_lib.lib.gpumem_wake(client, ms), client, "gpumem: wake")


def sleeping_bytes(device=None):
    """Bytes a wake() needs (0 when awake)."""
    return _lib.lib.gpumem_sleeping_bytes(_session(device))


def sleeping_pinned_bytes(device=None):
    """Of the data a sleep keeps, the bytes in page-locked host memory (0 when
    awake, on the host backend, or when pinning failed or was bounded to 0 by
    GPUMEM_SLEEP_PINNED_MAX)."""
    return _lib.lib.gpumem_sleeping_pinned_bytes(_session(device))


# ---- snapshots and history ----

def _snapshot_bytes(device, fmt, pid):
    client = _session(device)
    data, size = _lib.ctypes.c_void_p(), _lib.ctypes.c_size_t()
    _check(_lib.lib.gpumem_snapshot(client, fmt, int(pid), data, size), client, "gpumem: snapshot")
    try:
        return _lib.ctypes.string_at(data, size.value)
    finally:
        _lib.lib.gpumem_buffer_free(data)


def _as_pytorch(snapshot):
    """JSON has no tuples; PyTorch's snapshot has them for segment_pool_id."""
    for seg in snapshot.get("segments", []):
        if isinstance(seg.get("segment_pool_id"), list):
            seg["segment_pool_id"] = tuple(seg["segment_pool_id"])
    return snapshot


def _snapshot(device=None, *, pid=None):
    """torch.cuda.memory._snapshot(): {"segments", "device_traces",
    "allocator_settings", "external_annotations"}, of this process (pid None);
    of process `pid`; or with pid=0 of everything the caller may see (its
    tenant, or the whole device for an admin). torch.cuda._memory_viz reads it."""
    raw = _snapshot_bytes(device, _lib.SNAPSHOT_JSON, os.getpid() if pid is None else pid)
    return _as_pytorch(json.loads(raw.decode()))


def memory_snapshot(device=None, *, pid=None):
    """torch.cuda.memory_snapshot(): the segments of _snapshot()."""
    return _snapshot(device, pid=pid)["segments"]


def _dump_snapshot(filename="dump_snapshot.pickle", device=None, *, pid=None):
    """torch.cuda.memory._dump_snapshot(): the snapshot as a pickle file, which
    pytorch.org/memory_viz and torch.cuda._memory_viz open."""
    raw = _snapshot_bytes(device, _lib.SNAPSHOT_PICKLE, os.getpid() if pid is None else pid)
    with io.open(filename, "wb") as f:  # gpumem.open is a shared object's
        f.write(raw)


# The daemon's trace ring holds at most this many entries.
_MAX_HISTORY = 100_000_000

_frames_local = threading.local()
_code_names = {}  # code object -> (filename, name) encoded once
_MAX_CODE_NAMES = 100_000


def _code_bytes(code):
    names = _code_names.get(code)
    if names is None:
        if len(_code_names) >= _MAX_CODE_NAMES:  # code made at run time without end
            _code_names.clear()
        names = _code_names[code] = (code.co_filename.encode(errors="replace"), code.co_name.encode(errors="replace"))
    return names


def _collect_frames(userdata, frames, max_frames):
    """libgpumem_torch's frame hook: the allocating thread's Python stack,
    innermost first. The encoded strings live until the thread's next call."""
    try:
        frame = sys._getframe(1)
    except ValueError:  # no Python code on this thread's stack
        return 0
    try:
        keep = []
        n = 0
        while frame is not None and n < max_frames:
            filename, name = _code_bytes(frame.f_code)
            keep += (filename, name)
            frames[n].filename = filename
            frames[n].line = frame.f_lineno or 0
            frames[n].name = name
            n += 1
            frame = frame.f_back
        _frames_local.keep = keep
        return n
    except Exception:  # a hook must never fail an allocation
        return 0


# Kept for the process's life: an allocation racing with a change may still call it.
_FRAME_HOOK = _lib.FRAME_HOOK(_collect_frames)


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None):
    """torch.cuda.memory._record_memory_history(): turns this process's
    allocation history on ("all", "state" or True) or off (None or False:
    clears it, as in PyTorch); it needs no rights, and this process's
    _snapshot() shows it. With admin rights it is the daemon's trace ring
    of the whole device instead (`gpumemctl history`). With a
    context (not None) this process's allocations through PyTorch carry their
    Python stack (stacks "python" and "all" record the same: gpumemd sees no
    C++ frames). max_entries bounds the ring (at most 100000000, and
    1000000 for one's own; the default, sys.maxsize, keeps the daemon's
    bound)."""
    if enabled not in (None, False, True, "state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
    if context not in (None, "state", "alloc", "all") or stacks not in ("python", "all"):
        raise ValueError("context is None, 'state', 'alloc' or 'all'; stacks 'python' or 'all'")
    on = enabled not in (None, False)
    bound = 0 if max_entries >= sys.maxsize else min(int(max_entries), _MAX_HISTORY)
    if on and bound <= 0 and max_entries < sys.maxsize:
        raise ValueError("max_entries must be positive")
    client = _session(device)
    state = _lib.HistoryState()
    _check(_lib.lib.gpumem_history(client, on, bound, state), client, "gpumem: memory history")
    if on and context is not None:
        _lib.torch_lib.gpumem_torch_set_frame_hook(_FRAME_HOOK, None)
    else:
        _lib.torch_lib.gpumem_torch_set_frame_hook(_lib.FRAME_HOOK(), None)


# ---- what only gpumemd has ----

def _fields(struct):
    out = {}
    for name, _ in struct._fields_:
        value = getattr(struct, name)
        out[name] = value.decode(errors="replace") if isinstance(value, bytes) else value
    return out


def _take_list(fill, what, client):
    ptr = _lib.ctypes.POINTER(fill.struct)()
    n = _lib.ctypes.c_size_t()
    _check(fill(ptr, n), client, what)
    try:
        return [_fields(ptr[i]) for i in range(n.value)]
    finally:
        _lib.lib.gpumem_buffer_free(ptr)


def list_clients(device=None):
    """The sessions on the device that the caller may see (its tenant's; every
    one for an admin), with the keys of `gpumemctl clients --json`:
    session_id, pid, uid, tenant, unit, name, reserved_bytes, allocated_bytes,
    cached_bytes, segments, releasing_bytes, control, heap ("local" or
    "central"), stats_page_invalid, requests, asleep, sleeping_bytes."""
    client = _session(device)

    def fill(ptr, n):
        return _lib.lib.gpumem_list_clients(client, ptr, n)
    fill.struct = _lib.ClientInfo
    return _take_list(fill, "gpumem: clients", client)


def quotas(device=None, tenant=None):
    """Tenants' quotas and use (`gpumemctl quota list`): tenant, quota (bytes,
    0 = none), quota_source, charged_bytes, allocated_bytes, cached_bytes,
    sessions. `tenant` narrows the list to one."""
    client = _session(device)

    def fill(ptr, n):
        return _lib.lib.gpumem_quota_list(client, None if tenant is None else tenant.encode(), ptr, n)
    fill.struct = _lib.TenantInfo
    return _take_list(fill, "gpumem: quotas", client)


def get_quota(tenant=None, device=None):
    """One tenant's entry of quotas(): the caller's own when tenant is None."""
    found = quotas(device, tenant or "")
    return found[0] if found else None


def set_quota(tenant, nbytes, *, runtime=False, device=None):
    """Sets a tenant's quota in bytes (0 removes it; admin). Persistent unless
    runtime=True, which lasts until the daemon restarts."""
    client = _session(device)
    _check(_lib.lib.gpumem_quota_set(client, tenant.encode(), int(nbytes), bool(runtime)), client, "gpumem: quota")


class Refusal(collections.namedtuple("Refusal", "errno strerror message count")):
    """The last allocation gpumemd refused on a device: errno (ENOMEM, EDQUOT,
    ENODEV, ...), its text, the daemon's diagnosis, and how many were refused."""

    def __str__(self):
        return self.message


def last_refusal(device=None):
    """The last refusal of the PyTorch allocator on a device, or None."""
    index = _device_index(device)
    buf = _lib.ctypes.create_string_buffer(4096)
    count = _lib.ctypes.c_uint64()
    err = _lib.torch_lib.gpumem_torch_last_refusal(index, buf, len(buf), count)
    if err == 0:
        return None
    return Refusal(-err, _lib.lib.gpumem_strerror(err).decode(), buf.value.decode(errors="replace"), count.value)


# ---- claims ----

def claim(nbytes, device=None):
    """Sets aside up to nbytes of the device for this session, in one step
    with the answer: returns what was set aside (at most what mem_get_info()
    offers). Size a KV cache from the return value, not from mem_get_info():
    two engines starting together never get the same memory. The claim is
    used up as this session allocates, is not offered to anyone else, and
    lapses when the session ends or with claim(0) (a daemon restart keeps
    it, as far as the new daemon has it free); a new claim replaces it."""
    client = _session(device)
    claimed = _lib.ctypes.c_uint64()
    _check(_lib.lib.gpumem_claim(client, int(nbytes), claimed), client, "gpumem: claim")
    return claimed.value


# ---- shared objects ----

def share(name, tensors, readers=None, retention=0, device=None):
    """Publishes `tensors` (a dict name -> tensor: a state_dict, objects with
    __cuda_array_interface__, or host buffers such as bytes or array.array)
    as the read-only shared object `name` (docs/shared.md): one staging
    object holds them all, each C-contiguous and aligned to 256 bytes, the
    bytes are copied in (torch's copy_; without torch on host, a memory
    copy), and the layout (name -> dtype, shape, strides, offset) is kept as
    the object's meta. Returns its version (the name's previous + 1).
    `readers`: tenant names admitted to open it ("*": every tenant; None:
    the caller's tenant only); `retention`: seconds until it is withdrawn
    (0: until unpublish()). The object is charged to the caller's tenant
    and outlives this process. Copying device memory needs torch."""
    return _shared.share(name, tensors, readers, retention, device)


def open(name, version=0, device=None):
    """Maps shared object `name` (version 0: the newest) read-only and
    returns its tensors as a dict name -> tensor, zero copy: torch tensors
    when torch is loaded (torch cannot mark them read-only: a write faults
    on cuda, and on host ends the process with SIGSEGV), else objects with
    __cuda_array_interface__ (readonly) on cuda, read-only memoryviews on
    host. The mapping stays while any returned object lives, or until
    close(name). PermissionError when the caller's tenant is not admitted."""
    return _shared.open(name, version, device)


def close(name):
    """Unmaps every mapping of `name` this process opened, at once; the
    objects open() returned for it must not be used afterwards. Returns how
    many mappings were closed."""
    return _shared.close(name)


def unpublish(name, version=0, device=None):
    """Withdraws name@version (0: every version): nobody opens it again, and
    its memory goes back once its last mapper closed it. The publisher's
    tenant or an admin."""
    _shared.unpublish(name, version, device)


from . import _shared  # noqa: E402  (it uses the helpers above)

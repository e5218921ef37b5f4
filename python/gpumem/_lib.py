"""ctypes declarations of libgpumem and libgpumem_torch (gpumem/gpumem.h,
gpumem/torch.h). Internal: the public names are in gpumem/__init__.py.

The libraries are looked up in $GPUMEM_LIBRARY_DIR, then where `cmake --install`
put them (_libdir.py), then by soname through the dynamic loader.
"""
import ctypes
import os

c_client_p = ctypes.c_void_p
c_stats_p = ctypes.c_void_p
c_shared_p = ctypes.c_void_p
c_admin_p = ctypes.c_void_p


class Frame(ctypes.Structure):
    _fields_ = [("filename", ctypes.c_char_p), ("line", ctypes.c_uint32), ("name", ctypes.c_char_p)]


class HistoryState(ctypes.Structure):
    _fields_ = [("enabled", ctypes.c_bool), ("max_entries", ctypes.c_uint64), ("entries", ctypes.c_uint64)]


class ClientInfo(ctypes.Structure):
    _fields_ = [
        ("session_id", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("tenant", ctypes.c_char_p),
        ("unit", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
        ("reserved_bytes", ctypes.c_uint64),
        ("allocated_bytes", ctypes.c_uint64),
        ("cached_bytes", ctypes.c_uint64),
        ("segments", ctypes.c_uint64),
        ("releasing_bytes", ctypes.c_uint64),
        ("control", ctypes.c_bool),
        ("heap", ctypes.c_char_p),
        ("stats_page_invalid", ctypes.c_bool),
        ("requests", ctypes.c_uint64),
        ("asleep", ctypes.c_bool),
        ("sleeping_bytes", ctypes.c_uint64),
    ]


class TenantInfo(ctypes.Structure):
    _fields_ = [
        ("tenant", ctypes.c_char_p),
        ("quota", ctypes.c_uint64),
        ("quota_source", ctypes.c_char_p),
        ("charged_bytes", ctypes.c_uint64),
        ("allocated_bytes", ctypes.c_uint64),
        ("cached_bytes", ctypes.c_uint64),
        ("sessions", ctypes.c_uint32),
    ]


# gpumem_frame_hook: size_t (*)(void *userdata, gpumem_frame *frames, size_t max_frames)
FRAME_HOOK = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(Frame), ctypes.c_size_t)

MAX_FRAMES = 64
MAX_DEVICES = 64
SCOPES = {"session": 0, "device": 1, "tenant": 2, "pid": 3}
SNAPSHOT_PICKLE = 0
SNAPSHOT_JSON = 1

_SIGNATURES = {
    # libgpumem
    "gpumem_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "gpumem_last_error": (ctypes.c_char_p, [c_client_p]),
    "gpumem_trim": (ctypes.c_int, [c_client_p, ctypes.POINTER(ctypes.c_uint64)]),
    "gpumem_trim_tenant": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]),
    "gpumem_stats_get": (ctypes.c_int, [c_client_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32,
                                        ctypes.POINTER(c_stats_p)]),
    "gpumem_stats_free": (None, [c_stats_p]),
    "gpumem_stats_count": (ctypes.c_size_t, [c_stats_p]),
    "gpumem_stats_name": (ctypes.c_char_p, [c_stats_p, ctypes.c_size_t]),
    "gpumem_stats_value": (ctypes.c_int64, [c_stats_p, ctypes.c_size_t]),
    "gpumem_stats_device": (ctypes.c_int, [c_stats_p]),
    "gpumem_stats_capacity": (ctypes.c_uint64, [c_stats_p]),
    "gpumem_stats_sessions": (ctypes.c_uint64, [c_stats_p]),
    "gpumem_stats_summary": (ctypes.c_int, [c_stats_p, ctypes.c_bool, ctypes.POINTER(ctypes.c_void_p)]),
    "gpumem_reset_stats": (ctypes.c_int, [c_client_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_bool, ctypes.c_bool]),
    "gpumem_snapshot": (ctypes.c_int, [c_client_p, ctypes.c_int, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_size_t)]),
    "gpumem_history": (ctypes.c_int, [c_client_p, ctypes.c_bool, ctypes.c_uint64, ctypes.POINTER(HistoryState)]),
    "gpumem_list_clients": (ctypes.c_int, [c_client_p, ctypes.POINTER(ctypes.POINTER(ClientInfo)),
                                           ctypes.POINTER(ctypes.c_size_t)]),
    "gpumem_quota_list": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(TenantInfo)),
                                         ctypes.POINTER(ctypes.c_size_t)]),
    "gpumem_quota_set": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_bool]),
    "gpumem_mem_get_info": (ctypes.c_int, [c_client_p, ctypes.POINTER(ctypes.c_uint64),
                                           ctypes.POINTER(ctypes.c_uint64)]),
    "gpumem_buffer_free": (None, [ctypes.c_void_p]),
    # sleep and wake
    "gpumem_sleep": (ctypes.c_int, [c_client_p, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
                                    ctypes.POINTER(ctypes.c_uint64)]),
    "gpumem_wake": (ctypes.c_int, [c_client_p, ctypes.c_uint32]),
    "gpumem_sleeping_bytes": (ctypes.c_uint64, [c_client_p]),
    "gpumem_sleeping_pinned_bytes": (ctypes.c_uint64, [c_client_p]),
    "gpumem_claim": (ctypes.c_int, [c_client_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]),
    "gpumem_shared_create": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.c_uint64,
                                            ctypes.POINTER(c_shared_p), ctypes.POINTER(ctypes.c_void_p)]),
    "gpumem_shared_publish": (ctypes.c_int, [c_client_p, c_shared_p, ctypes.POINTER(ctypes.c_char_p),
                                             ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32,
                                             ctypes.POINTER(ctypes.c_uint64)]),
    "gpumem_shared_open": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(c_shared_p)]),
    "gpumem_shared_ptr": (ctypes.c_void_p, [c_shared_p]),
    "gpumem_shared_size": (ctypes.c_uint64, [c_shared_p]),
    "gpumem_shared_version": (ctypes.c_uint64, [c_shared_p]),
    "gpumem_shared_meta": (ctypes.c_int, [c_shared_p, ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.POINTER(ctypes.c_size_t)]),
    "gpumem_shared_close": (None, [c_client_p, c_shared_p]),
    "gpumem_shared_unpublish": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.c_uint64]),
    "gpumem_admin_socket": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
    "gpumem_admin_new": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(c_admin_p)]),
    "gpumem_admin_connect": (ctypes.c_int, [c_admin_p]),
    "gpumem_admin_backend": (ctypes.c_char_p, [c_admin_p]),
    "gpumem_admin_free": (None, [c_admin_p]),
    # tagged pools
    "gpumem_pool_begin": (ctypes.c_int, [c_client_p, ctypes.c_char_p]),
    "gpumem_pool_end": (ctypes.c_int, [c_client_p]),
    "gpumem_pool_current": (ctypes.c_char_p, [c_client_p]),
    "gpumem_stat_tag": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]),
    # libgpumem_torch
    "gpumem_torch_alloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "gpumem_torch_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "gpumem_torch_empty_cache": (None, []),
    "gpumem_torch_client": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(c_client_p)]),
    "gpumem_torch_last_refusal": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                                 ctypes.POINTER(ctypes.c_uint64)]),
    "gpumem_torch_set_frame_hook": (None, [FRAME_HOOK, ctypes.c_void_p]),
    "gpumem_torch_pool_kept_bytes": (ctypes.c_uint64, [ctypes.c_int]),
    "gpumem_torch_oom_mode": (ctypes.c_int, []),
    "gpumem_torch_memory_fraction": (ctypes.c_double, [ctypes.c_int]),
}

# gpumem_torch_oom_mode(): how a refusal through gpumem_torch_malloc reaches PyTorch.
OOM_MODES = {0: "null", 1: "runtime_error", 2: "c10"}


def _candidates(soname):
    env = os.environ.get("GPUMEM_LIBRARY_DIR")
    if env:
        yield os.path.join(env, soname)
    try:
        from ._libdir import LIBDIR  # written by cmake --install
        yield os.path.join(LIBDIR, soname)
    except ImportError:
        pass
    yield soname


def _load(soname):
    errors = []
    for path in _candidates(soname):
        if os.sep in path:
            path = os.path.abspath(path)  # PyTorch loads it again by this name
        try:
            return ctypes.CDLL(path), path
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    raise OSError(f"gpumem: cannot load {soname} (set GPUMEM_LIBRARY_DIR to its directory): " + "; ".join(errors))


# libgpumem first: libgpumem_torch's need for it is then met by this copy,
# wherever the loader's own search path would have looked.
lib, LIBRARY_PATH = _load("libgpumem.so.0")
torch_lib, TORCH_LIBRARY_PATH = _load("libgpumem_torch.so.0")
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _fn = getattr(torch_lib if _name.startswith("gpumem_torch_") else lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes

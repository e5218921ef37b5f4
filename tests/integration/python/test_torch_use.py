"""gpumem.torch.use() against PyTorch's allocator surface. No PyTorch with
CUDA runs here (Debian's python3-torch is 1.13, without pluggable
allocators), so each child process imports a stand-in `torch` package written
by the test: the names use() touches, with PyTorch 2.x's behaviour where it
matters (CUDAPluggableAllocator loads the library with ctypes and takes the two
function addresses; allocations then go through those addresses with the C
types of torch/csrc/cuda/CUDAPluggableAllocator.h). The real run is
scripts/gpu-check/torch_train.py on a GPU machine."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import pytorch_env

# PyTorch 2.11's Python surface of a pluggable allocator, by name and
# signature: torch/cuda/memory.py (CUDAPluggableAllocator(path_to_so_file,
# alloc_fn_name, free_fn_name) loading the library with ctypes and passing the
# two addresses to torch._C._cuda_customAllocator; change_current_allocator;
# memory_stats(device=None) ... reset_peak_memory_stats(device=None),
# memory_summary(device=None, abbreviated=False), empty_cache(),
# set_per_process_memory_fraction(fraction, device=None)) and
# torch/csrc/cuda/Module.cpp (_CUDAPluggableAllocator's setters, each taking
# a function address, and the C types each is called through, from
# torch/csrc/cuda/CUDAPluggableAllocator.cpp). Under a pluggable allocator
# the statistics raise, as CUDAPluggableAllocator::getDeviceStats does.
STANDIN_C = '''
import ctypes

class MempoolId(ctypes.Structure):  # c10::cuda::MempoolId_t, std::pair<unsigned long long, unsigned long long>
    _fields_ = [("first", ctypes.c_ulonglong), ("second", ctypes.c_ulonglong)]

TYPES = {
    "alloc": ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p),
    "free": ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p),
    "set_init_fn": ctypes.CFUNCTYPE(None, ctypes.c_int),
    "set_reset_fn": ctypes.CFUNCTYPE(None),
    "set_memory_fraction_fn": ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_int),
    "set_base_alloc_fn": ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p),
    "set_record_stream_fn": ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p),
    # the std::function<bool(cudaStream_t)> goes by address; None here: every stream
    "set_begin_allocate_to_pool": ctypes.CFUNCTYPE(None, ctypes.c_int, MempoolId, ctypes.c_void_p),
    "set_end_allocate_to_pool_fn": ctypes.CFUNCTYPE(None, ctypes.c_int, MempoolId),
    "set_release_pool": ctypes.CFUNCTYPE(None, ctypes.c_int, MempoolId),
}
SETTERS = [name for name in TYPES if name.startswith("set_")]

class _CUDAPluggableAllocator:
    def __init__(self, alloc_fn, free_fn):
        self.fns = {"alloc": TYPES["alloc"](alloc_fn), "free": TYPES["free"](free_fn)}
        self.addresses = {"alloc": alloc_fn, "free": free_fn}

def _make_setter(name):
    def setter(self, func_ptr):
        assert isinstance(func_ptr, int) and func_ptr
        self.addresses[name] = func_ptr
        self.fns[name] = TYPES[name](func_ptr)
    setter.__name__ = name
    return setter

def _setters(names):
    for name in names:
        setattr(_CUDAPluggableAllocator, name, _make_setter(name))

_setters(SETTERS)
current = None

def _cuda_customAllocator(alloc_fn, free_fn):
    return _CUDAPluggableAllocator(alloc_fn, free_fn)

def _cuda_changeCurrentAllocator(allocator):
    global current
    if current is not None:
        raise RuntimeError("Can't swap an already initialized allocator")
    current = allocator

def _cuda_memoryStats(device):
    raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats. "
                       "If you need it, please file an issue describing your use case.")

def _cuda_resetPeakMemoryStats(device):
    raise RuntimeError("CUDAPluggableAllocator does not yet support resetPeakStats. "
                       "If you need it, please file an issue describing your use case.")

def _cuda_resetAccumulatedMemoryStats(device):
    raise RuntimeError("CUDAPluggableAllocator does not yet support resetAccumulatedStats. "
                       "If you need it, please file an issue describing your use case.")

def _cuda_emptyCache():
    if current is not None and "set_reset_fn" in current.fns:
        current.fns["set_reset_fn"]()

def _cuda_setMemoryFraction(fraction, device):
    if current is not None and "set_memory_fraction_fn" in current.fns:
        current.fns["set_memory_fraction_fn"](fraction, device)

def _cuda_getMemoryFraction(device):
    raise RuntimeError("CUDAPluggableAllocator does not yet support getMemoryFraction. "
                       "If you need it, please file an issue describing your use case.")
'''

STANDIN_2X = '''
import ctypes
import torch

class _CUDAAllocator:
    def __init__(self, allocator):
        self._allocator = allocator

    def allocator(self):
        return self._allocator

class CUDAPluggableAllocator(_CUDAAllocator):
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        allocator = ctypes.CDLL(path_to_so_file)
        alloc_fn = ctypes.cast(getattr(allocator, alloc_fn_name), ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(allocator, free_fn_name), ctypes.c_void_p).value
        assert alloc_fn is not None
        assert free_fn is not None
        self._allocator = torch._C._cuda_customAllocator(alloc_fn, free_fn)
        self.names = (path_to_so_file, alloc_fn_name, free_fn_name)

def change_current_allocator(allocator):
    torch._C._cuda_changeCurrentAllocator(allocator.allocator())

def memory_stats_as_nested_dict(device=None):
    return torch._C._cuda_memoryStats(0 if device is None else device)

def memory_stats(device=None):
    return memory_stats_as_nested_dict(device=device)  # flattened in PyTorch; raises first here

def memory_allocated(device=None):
    return memory_stats(device=device).get("allocated_bytes.all.current", 0)

def max_memory_allocated(device=None):
    return memory_stats(device=device).get("allocated_bytes.all.peak", 0)

def memory_reserved(device=None):
    return memory_stats(device=device).get("reserved_bytes.all.current", 0)

def max_memory_reserved(device=None):
    return memory_stats(device=device).get("reserved_bytes.all.peak", 0)

def reset_peak_memory_stats(device=None):
    return torch._C._cuda_resetPeakMemoryStats(0 if device is None else device)

def reset_accumulated_memory_stats(device=None):
    return torch._C._cuda_resetAccumulatedMemoryStats(0 if device is None else device)

def memory_summary(device=None, abbreviated=False):
    stats = memory_stats(device=device)
    return str(stats)

def empty_cache():
    torch._C._cuda_emptyCache()

def set_per_process_memory_fraction(fraction, device=None):
    if not isinstance(fraction, float) or fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    torch._C._cuda_setMemoryFraction(fraction, 0 if device is None else device)

def get_per_process_memory_fraction(device=None):
    return torch._C._cuda_getMemoryFraction(0 if device is None else device)
'''

# torch.cuda.device, the context manager: torch/cuda/_utils.py's
# _get_device_index takes one as a device (its .idx).
STANDIN_DEVICE = '''
class device:
    def __init__(self, device):
        self.idx = device if isinstance(device, int) else int(str(device).rpartition(":")[2] or 0)
'''

# torch.cuda re-exports memory.py's public names, as torch/cuda/__init__.py does.
CUDA_EXPORTS = ("memory_stats", "memory_stats_as_nested_dict", "memory_allocated", "max_memory_allocated",
                "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
                "reset_accumulated_memory_stats", "memory_summary", "empty_cache",
                "set_per_process_memory_fraction", "get_per_process_memory_fraction")


def standin(root, version, initialized=False, pluggable=True, setters=None):
    pkg = root / "torch"
    (pkg / "cuda").mkdir(parents=True)
    c_module = STANDIN_C
    if setters is not None:  # an older PyTorch: only these setters exist
        c_module = c_module.replace("_setters(SETTERS)", f"_setters({setters!r})")
    (pkg / "_C.py").write_text(c_module)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nfrom . import _C, cuda\n")
    exports = f"from .memory import {', '.join(CUDA_EXPORTS)}\n" if pluggable else ""
    (pkg / "cuda" / "__init__.py").write_text(
        f"from . import memory\n{exports}def is_initialized():\n    return {initialized!r}\n"
        "def is_available():\n    return False\n" + STANDIN_DEVICE)
    (pkg / "cuda" / "memory.py").write_text(STANDIN_2X if pluggable else "def memory_stats(device=None):\n    return {}\n")
    return str(root)


def run(code, torch_dir):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                         env=pytorch_env(torch_dir))
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_refused_on_pytorch_1_13(daemons, tmp_path):
    lines = run('''
        import gpumem.torch
        try:
            gpumem.torch.use()
        except RuntimeError as e:
            print(e)
        print(gpumem.torch.installed())
        print(gpumem.memory_allocated())  # the rest of the package works without it
    ''', standin(tmp_path, "1.13.1", pluggable=False))
    assert "PyTorch 1.13.1 has no pluggable CUDA allocator" in lines[0] and "2.0" in lines[0]
    assert lines[1:] == ["None", "0"]


def test_refused_after_the_first_cuda_allocation(daemons, tmp_path):
    lines = run('''
        import gpumem.torch
        try:
            gpumem.torch.use()
        except RuntimeError as e:
            print(e)
        import torch
        print(torch._C.current)
    ''', standin(tmp_path, "2.11.0", initialized=True))
    assert lines[0].startswith("gpumem.torch.use() must run before the first CUDA allocation")
    assert lines[1] == "None"


def test_installs_and_allocates_through_pytorchs_types(daemons, tmp_path):
    lines = run('''
        import os, gpumem, gpumem.torch, torch
        a = gpumem.torch.use(1)
        assert torch._C.current is a._allocator and gpumem.torch.use() is a
        path, alloc_name, free_name = a.names
        print(os.path.basename(path), alloc_name, free_name)
        fns = a._allocator.fns
        p = fns["alloc"](3 << 20, 1, None)
        print(gpumem.memory_stats(1)["requested_bytes.all.current"])
        fns["free"](p, 3 << 20, 1, None)
        print(gpumem.memory_stats(1)["requested_bytes.all.current"], gpumem.last_refusal(1))
    ''', standin(tmp_path, "2.11.0"))
    # gpumem_torch_malloc: gpumem_torch_alloc that throws on a refusal (a C++ build)
    assert lines == ["libgpumem_torch.so.0 gpumem_torch_malloc gpumem_torch_free", str(3 << 20), "0 None"]


def test_every_hook_installed_and_called_by_pytorch(daemons, tmp_path):
    lines = run('''
        import ctypes, gpumem, gpumem.torch, torch
        a = gpumem.torch.use(1)
        print(" ".join(gpumem.torch.hooks()))
        lib = ctypes.CDLL(a.names[0])
        for setter, name in gpumem.torch.HOOKS:
            assert a._allocator.addresses[setter] == ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, setter
        fns = a._allocator.fns
        raw_alloc = torch._C.TYPES["alloc"](ctypes.cast(lib.gpumem_torch_alloc, ctypes.c_void_p).value)

        # record_stream, then empty_cache through the reset hook.
        p = fns["alloc"](4 << 20, 1, None)
        fns["set_record_stream_fn"](p, 2)
        fns["free"](p, 4 << 20, 1, None)
        torch.cuda.empty_cache()
        print(gpumem.memory_reserved(1))

        # set_per_process_memory_fraction: 0.25 of 512 MiB.
        torch.cuda.set_per_process_memory_fraction(0.25, 1)
        big = fns["alloc"](100 << 20, 1, None)
        print(raw_alloc(64 << 20, 1, None), gpumem.last_refusal(1).errno, "memory fraction 0.25" in str(gpumem.last_refusal(1)))
        fns["free"](big, 100 << 20, 1, None)
        torch.cuda.set_per_process_memory_fraction(1.0, 1)

        # A graph's private pool: freed blocks stay in it until release_pool.
        pool = torch._C.MempoolId(1, 0)
        fns["set_begin_allocate_to_pool"](1, pool, None)
        q = fns["alloc"](8 << 20, 1, None)
        fns["set_end_allocate_to_pool_fn"](1, pool)
        fns["free"](q, 8 << 20, 1, None)
        eager = fns["alloc"](8 << 20, 1, None)
        print(eager != q, gpumem.memory_allocated(1), gpumem.torch._lib.torch_lib.gpumem_torch_pool_kept_bytes(1))
        fns["set_release_pool"](1, pool)
        fns["free"](eager, 8 << 20, 1, None)
        print(gpumem.torch._lib.torch_lib.gpumem_torch_pool_kept_bytes(1), gpumem.memory_allocated(1))
        print(gpumem.torch.oom_mode())
    ''', standin(tmp_path, "2.11.0"))
    assert lines[0] == ("set_record_stream_fn set_reset_fn set_memory_fraction_fn set_begin_allocate_to_pool "
                        "set_end_allocate_to_pool_fn set_release_pool")
    assert lines[1] == "0"
    assert lines[2] == "None 12 True"  # NULL, ENOMEM, the diagnosis
    assert lines[3] == f"True {16 << 20} {8 << 20}"
    assert lines[4] == "0 0"
    assert lines[5] in ("runtime_error", "c10")  # a C++ build; c10 against PyTorch's headers


def test_older_pytorch_gets_the_hooks_it_has(daemons, tmp_path):
    lines = run('''
        import gpumem.torch
        gpumem.torch.use()
        print(" ".join(gpumem.torch.hooks()))
    ''', standin(tmp_path, "2.0.1", setters=["set_init_fn", "set_reset_fn", "set_memory_fraction_fn",
                                               "set_base_alloc_fn", "set_record_stream_fn"]))
    assert lines == ["set_record_stream_fn set_reset_fn set_memory_fraction_fn"]


def test_torch_cuda_memory_api_answers_after_use(daemons, tmp_path):
    lines = run('''
        import gpumem, gpumem.torch, torch
        try:
            torch.cuda.memory_allocated(1)
        except RuntimeError as e:
            print("before:", "getDeviceStats" in str(e))
        a = gpumem.torch.use(1)
        fns = a._allocator.fns
        p = fns["alloc"](6 << 20, 1, None)
        print(torch.cuda.memory_allocated(1), torch.cuda.memory.memory_allocated(1),
              torch.cuda.memory_stats(1)["allocated_bytes.all.current"])
        fns["free"](p, 6 << 20, 1, None)
        print(torch.cuda.memory_allocated(1), torch.cuda.max_memory_allocated(1) >= 6 << 20,
              torch.cuda.memory_reserved(1) > 0, torch.cuda.max_memory_reserved(1) > 0)
        torch.cuda.reset_peak_memory_stats(1)
        torch.cuda.reset_accumulated_memory_stats(1)
        print(torch.cuda.max_memory_allocated(1), torch.cuda.memory_stats_as_nested_dict(1)["allocated_bytes"]["all"]["current"])
        print("Allocated memory" in torch.cuda.memory_summary(1) or torch.cuda.memory_summary(1)[:40])
        gpumem.torch.unuse()
        try:
            torch.cuda.memory_allocated(1)
        except RuntimeError as e:
            print("after unuse:", "getDeviceStats" in str(e))
        gpumem.torch.use()
        print(torch.cuda.memory_allocated(1))
    ''', standin(tmp_path, "2.11.0"))
    assert lines == ["before: True", f"{6 << 20} {6 << 20} {6 << 20}", "0 True True True", "0 0", "True",
                     "after unuse: True", "0"]


def test_memory_api_takes_pytorchs_device_arguments(daemons, tmp_path):
    # torch/cuda/_utils.py's _get_device_index: an int, "cuda:N", torch.device
    # and torch.cuda.device(N) (the stand-in's; this checks our side's parsing only).
    lines = run('''
        import gpumem, gpumem.torch, torch
        a = gpumem.torch.use(1)
        p = a._allocator.fns["alloc"](2 << 20, 1, None)
        print(torch.cuda.memory_allocated(1), torch.cuda.memory_allocated("cuda:1"),
              torch.cuda.memory_allocated(torch.cuda.device(1)), torch.cuda.memory_stats(torch.cuda.device(1))[
                  "allocated_bytes.all.current"])
        a._allocator.fns["free"](p, 2 << 20, 1, None)
    ''', standin(tmp_path, "2.11.0"))
    assert lines == [" ".join([str(2 << 20)] * 4)]


def test_memory_fraction_read_back_and_zero(daemons, tmp_path):
    # PyTorch's get_per_process_memory_fraction raises under a pluggable
    # allocator (the stand-in raises as CUDAPluggableAllocator::getMemoryFraction
    # does); after use() it reads the library's fraction. 0 is in PyTorch's range.
    lines = run('''
        import ctypes, gpumem, gpumem.torch, torch
        try:
            torch.cuda.get_per_process_memory_fraction(1)
        except RuntimeError as e:
            print("before:", "getMemoryFraction" in str(e))
        a = gpumem.torch.use(1)
        print(torch.cuda.get_per_process_memory_fraction(1))
        torch.cuda.set_per_process_memory_fraction(0.25, 1)
        print(torch.cuda.get_per_process_memory_fraction("cuda:1"), torch.cuda.memory.get_per_process_memory_fraction(0))
        torch.cuda.set_per_process_memory_fraction(0.0, 1)
        lib = ctypes.CDLL(a.names[0])  # the NULL entry point: the installed one throws, which ctypes cannot carry
        raw_alloc = torch._C.TYPES["alloc"](ctypes.cast(lib.gpumem_torch_alloc, ctypes.c_void_p).value)
        print(torch.cuda.get_per_process_memory_fraction(1), raw_alloc(4096, 1, None), gpumem.last_refusal(1).errno)
        torch.cuda.set_per_process_memory_fraction(1.0, 1)
        print(torch.cuda.get_per_process_memory_fraction(1))
    ''', standin(tmp_path, "2.11.0"))
    assert lines == ["before: True", "1.0", "0.25 1.0", "0.0 None 12", "1.0"]


def test_device_without_daemon_fails_at_use(daemons, tmp_path):
    lines = run('''
        import gpumem, gpumem.torch, torch
        try:
            gpumem.torch.use("cuda:7")
        except gpumem.GpumemError as e:
            print(e.errno, "gpu7.sock" in str(e))
        print(torch._C.current)
    ''', standin(tmp_path, "2.11.0"))
    assert lines == ["19 True", "None"]  # ENODEV, naming the socket; nothing installed


def test_real_pytorch_if_installed(daemons):
    torch = pytest.importorskip("torch")
    import gpumem.torch
    if not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        with pytest.raises(RuntimeError, match="no pluggable CUDA allocator"):
            gpumem.torch.use()
    elif not torch.cuda.is_available():
        pytest.skip("PyTorch 2.x without CUDA: scripts/gpu-check/torch_train.py covers a GPU machine")


@pytest.mark.parametrize("version, reason", [("1.13.1", "PyTorch 1.13.1 has no pluggable CUDA allocator"),
                                             ("2.11.0", "CUDA is not available")])
def test_train_script_skips(tmp_path, version, reason):
    script = os.environ.get("GM_TORCH_TRAIN")
    if not script or not os.path.exists(script):
        pytest.skip("scripts/gpu-check/torch_train.py not present")
    out = subprocess.run([sys.executable, script, "--build", "/nonexistent"], capture_output=True, text=True,
                         timeout=60, env=pytorch_env(standin(tmp_path, version, pluggable=version != "1.13.1")))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith("SKIP") and reason in out.stdout, out.stdout

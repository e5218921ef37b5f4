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

STANDIN_2X = '''
import ctypes
current = None

class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path_to_so_file)
        self.alloc_fn = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
        self.free_fn = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
        assert self.alloc_fn and self.free_fn
        self.names = (path_to_so_file, alloc_fn_name, free_fn_name)

def change_current_allocator(allocator):
    global current
    if current is not None:
        raise RuntimeError("Can't swap an already initialized allocator")
    current = allocator
'''


def standin(root, version, initialized=False, pluggable=True):
    pkg = root / "torch"
    (pkg / "cuda").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nfrom . import cuda\n")
    (pkg / "cuda" / "__init__.py").write_text(
        f"from . import memory\ndef is_initialized():\n    return {initialized!r}\n"
        "def is_available():\n    return False\n")
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
        print(torch.cuda.memory.current)
    ''', standin(tmp_path, "2.4.0", initialized=True))
    assert lines[0].startswith("gpumem.torch.use() must run before the first CUDA allocation")
    assert lines[1] == "None"


def test_installs_and_allocates_through_pytorchs_types(daemons, tmp_path):
    lines = run('''
        import ctypes, gpumem, gpumem.torch, torch
        a = gpumem.torch.use(1)
        assert torch.cuda.memory.current is a and gpumem.torch.use() is a
        path, alloc_name, free_name = a.names
        print(os.path.basename(path), alloc_name, free_name)
        alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(a.alloc_fn)
        free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(a.free_fn)
        p = alloc(3 << 20, 1, None)
        ctypes.memset(p, 1, 3 << 20)
        print(gpumem.memory_stats(1)["requested_bytes.all.current"])
        free(p, 3 << 20, 1, None)
        print(gpumem.memory_stats(1)["requested_bytes.all.current"], gpumem.last_refusal(1))
    '''.replace("import ctypes", "import os, ctypes"), standin(tmp_path, "2.4.0"))
    assert lines == ["libgpumem_torch.so.0 gpumem_torch_alloc gpumem_torch_free", str(3 << 20), "0 None"]


def test_device_without_daemon_fails_at_use(daemons, tmp_path):
    lines = run('''
        import gpumem, gpumem.torch, torch
        try:
            gpumem.torch.use("cuda:7")
        except gpumem.GpumemError as e:
            print(e.errno, "gpu7.sock" in str(e))
        print(torch.cuda.memory.current)
    ''', standin(tmp_path, "2.4.0"))
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
                                             ("2.4.0", "CUDA is not available")])
def test_train_script_skips(tmp_path, version, reason):
    script = os.environ.get("GM_TORCH_TRAIN")
    if not script or not os.path.exists(script):
        pytest.skip("scripts/gpu-check/torch_train.py not present")
    out = subprocess.run([sys.executable, script, "--build", "/nonexistent"], capture_output=True, text=True,
                         timeout=60, env=pytorch_env(standin(tmp_path, version, pluggable=version != "1.13.1")))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith("SKIP") and reason in out.stdout, out.stdout

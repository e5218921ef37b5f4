"""gpumem.torch: gpumemd as PyTorch's CUDA allocator.

    import gpumem.torch
    gpumem.torch.use()        # first thing, before any tensor is put on a GPU

PyTorch then allocates every CUDA tensor through libgpumem_torch
(torch.cuda.memory.CUDAPluggableAllocator, PyTorch 2.0 and later), one
gpumemd session per device. use() installs every hook the installed PyTorch's
torch._C._CUDAPluggableAllocator offers, each only where it has it:

  alloc          gpumem_torch_malloc (throws on a refusal, see oom_mode()),
                 else gpumem_torch_alloc (NULL: a tensor at address 0)
  free           gpumem_torch_free
  record_stream  gpumem_torch_record_stream   (tensor.record_stream(s))
  reset          gpumem_torch_empty_cache     (torch.cuda.empty_cache())
  memory_fraction gpumem_torch_set_memory_fraction
                 (torch.cuda.set_per_process_memory_fraction: enforced by the
                 library on the bytes it hands out on the device)
  graph pools    gpumem_torch_begin_allocate_to_pool / _end_ / release_pool
                 (torch.cuda.graph; torch.compile(mode="reduce-overhead")
                 with torch._inductor.config.triton.cudagraph_trees = False:
                 CUDA graph trees need allocator calls PyTorch 2.11's
                 pluggable allocator lacks)

and makes torch.cuda's memory functions (memory_allocated, memory_stats,
memory_summary, reset_peak_memory_stats, get_per_process_memory_fraction,
...), which raise under a pluggable allocator, answer with gpumemd's figures
for this process; unuse() puts
PyTorch's functions back (the allocator itself stays: PyTorch cannot swap it).
"""
import ctypes

from . import _device_index, _lib, _session

__all__ = ["use", "unuse", "installed", "hooks", "oom_mode", "PATCHED"]

ALLOC_FN = "gpumem_torch_alloc"
MALLOC_FN = "gpumem_torch_malloc"
FREE_FN = "gpumem_torch_free"

# _CUDAPluggableAllocator's setter -> libgpumem_torch's function
# (torch/csrc/cuda/Module.cpp binds each setter to a function address).
HOOKS = (
    ("set_record_stream_fn", "gpumem_torch_record_stream"),
    ("set_reset_fn", "gpumem_torch_empty_cache"),
    ("set_memory_fraction_fn", "gpumem_torch_set_memory_fraction"),
    ("set_begin_allocate_to_pool", "gpumem_torch_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "gpumem_torch_end_allocate_to_pool"),
    ("set_release_pool", "gpumem_torch_release_pool"),
)

# torch.cuda.memory's functions answered by gpumemd after use() (also
# replaced where torch.cuda re-exports them).
PATCHED = ("memory_stats", "memory_stats_as_nested_dict", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
           "reset_accumulated_memory_stats", "memory_summary", "get_per_process_memory_fraction")

_installed = None
_hooks = ()
_saved = {}


def _torch():
    try:
        import torch  # noqa: the real PyTorch, not this module
    except ImportError as exc:
        raise RuntimeError("gpumem.torch.use(): PyTorch is not installed") from exc
    return torch


def installed():
    """The allocator use() installed, or None."""
    return _installed


def hooks():
    """The setters of _CUDAPluggableAllocator that use() called (a tuple of names)."""
    return _hooks


def oom_mode():
    """How a refused allocation reaches PyTorch: "c10" (torch.OutOfMemoryError),
    "runtime_error" (RuntimeError with the same message: the library was built
    without PyTorch's headers) or "null" (no C++ entry point: PyTorch gets a
    NULL pointer and builds a tensor at address 0)."""
    return _lib.OOM_MODES.get(_lib.torch_lib.gpumem_torch_oom_mode(), "null")


def _address(name):
    fn = getattr(_lib.torch_lib, name, None)
    return ctypes.cast(fn, ctypes.c_void_p).value if fn is not None else None


def _install_hooks(allocator):
    """Calls each setter the installed PyTorch has; returns the names called."""
    inner = getattr(allocator, "_allocator", None)
    done = []
    for setter, fn_name in HOOKS:
        set_fn = getattr(inner, setter, None)
        address = _address(fn_name)
        if set_fn is not None and address:
            set_fn(address)
            done.append(setter)
    return tuple(done)


def _replacements():
    import gpumem

    def memory_stats(device=None):
        return gpumem.memory_stats(device)  # an OrderedDict, as PyTorch's

    def memory_summary(device=None, abbreviated=False):
        return gpumem.memory_summary(device, abbreviated)

    def get_per_process_memory_fraction(device=None):
        # CUDAPluggableAllocator::getMemoryFraction raises: the fraction the library enforces.
        return _lib.torch_lib.gpumem_torch_memory_fraction(_device_index(device))

    table = {"memory_stats": memory_stats, "memory_summary": memory_summary,
             "get_per_process_memory_fraction": get_per_process_memory_fraction}
    for name in PATCHED:
        if name not in table:
            ours = getattr(gpumem, name)
            table[name] = (lambda fn: lambda device=None: fn(device))(ours)
    for name, fn in table.items():
        fn.__name__ = name
        fn.__doc__ = f"torch.cuda.{name}, answered by gpumemd (gpumem.{name}) for this process's session."
    table["get_per_process_memory_fraction"].__doc__ = (
        "torch.cuda.get_per_process_memory_fraction, answered by libgpumem_torch: the fraction it enforces "
        "(set_per_process_memory_fraction), 1.0 when none is set.")
    return table


def _patch(torch):
    cuda = torch.cuda
    memory = getattr(cuda, "memory", None)
    for name, fn in _replacements().items():
        for module in (memory, cuda):
            if module is not None and hasattr(module, name):
                _saved[(module, name)] = getattr(module, name)
                setattr(module, name, fn)


def unuse():
    """Puts torch.cuda's own memory functions back (they raise again under a
    pluggable allocator). The allocator stays: PyTorch cannot swap it back."""
    while _saved:
        (module, name), fn = _saved.popitem()
        setattr(module, name, fn)


def use(device=None):
    """Makes gpumemd the allocator of every CUDA tensor of this process.

    Must run before the first CUDA allocation (PyTorch cannot swap an
    allocator it has started using), on a PyTorch with pluggable allocators
    (2.0 and later); it refuses with RuntimeError otherwise. With `device`,
    that device's daemon is connected now, so a missing daemon fails here
    rather than at the first tensor. Calling it again returns the same
    allocator (and patches torch.cuda's memory functions again after
    unuse()). Returns the torch.cuda.memory.CUDAPluggableAllocator."""
    global _installed, _hooks
    if _installed is not None:
        if device is not None:
            _session(device)
        if not _saved:
            _patch(_torch())
        return _installed
    torch = _torch()
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    pluggable = getattr(memory, "CUDAPluggableAllocator", None)
    change = getattr(memory, "change_current_allocator", None)
    if pluggable is None or change is None:
        raise RuntimeError(
            f"gpumem.torch.use(): PyTorch {getattr(torch, '__version__', '?')} has no pluggable CUDA allocator "
            "(torch.cuda.memory.CUDAPluggableAllocator comes with PyTorch 2.0); gpumemd cannot serve its tensors. "
            "The gpumem statistics, snapshot and quota functions work without it.")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "gpumem.torch.use() must run before the first CUDA allocation: CUDA is initialized in this process "
            "already, and PyTorch cannot swap an allocator it has started using. Call it at start-up, before "
            "any tensor, model or stream is put on a GPU.")
    if device is not None:
        _device_index(device)
        _session(device)
    alloc = MALLOC_FN if _address(MALLOC_FN) else ALLOC_FN
    allocator = pluggable(_lib.TORCH_LIBRARY_PATH, alloc, FREE_FN)
    installed_hooks = _install_hooks(allocator)
    try:
        change(allocator)
    except RuntimeError as exc:
        raise RuntimeError(f"gpumem.torch.use(): PyTorch refused the gpumemd allocator: {exc}") from exc
    _installed = allocator
    _hooks = installed_hooks
    _patch(torch)
    return allocator

"""gpumem.torch: gpumemd as PyTorch's CUDA allocator.

    import gpumem.torch
    gpumem.torch.use()        # first thing, before any tensor is put on a GPU

PyTorch then allocates every CUDA tensor through libgpumem_torch's
gpumem_torch_alloc / gpumem_torch_free (torch.cuda.memory.CUDAPluggableAllocator,
PyTorch 2.0 and later), one gpumemd session per device. torch.cuda's own
statistics and snapshot calls do not reach a pluggable allocator; use gpumem's
(gpumem.memory_stats(), gpumem.memory_summary(), gpumem._snapshot(), ...).
"""
from . import _device_index, _lib, _session

__all__ = ["use", "installed"]

ALLOC_FN = "gpumem_torch_alloc"
FREE_FN = "gpumem_torch_free"

_installed = None


def _torch():
    try:
        import torch  # noqa: the real PyTorch, not this module
    except ImportError as exc:
        raise RuntimeError("gpumem.torch.use(): PyTorch is not installed") from exc
    return torch


def installed():
    """The allocator use() installed, or None."""
    return _installed


def use(device=None):
    """Makes gpumemd the allocator of every CUDA tensor of this process.

    Must run before the first CUDA allocation (PyTorch cannot swap an
    allocator it has started using), on a PyTorch with pluggable allocators
    (2.0 and later); it refuses with RuntimeError otherwise. With `device`,
    that device's daemon is connected now, so a missing daemon fails here
    rather than at the first tensor. Calling it again returns the same
    allocator. Returns the torch.cuda.memory.CUDAPluggableAllocator."""
    global _installed
    if _installed is not None:
        if device is not None:
            _session(device)
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
    allocator = pluggable(_lib.TORCH_LIBRARY_PATH, ALLOC_FN, FREE_FN)
    try:
        change(allocator)
    except RuntimeError as exc:
        raise RuntimeError(f"gpumem.torch.use(): PyTorch refused the gpumemd allocator: {exc}") from exc
    _installed = allocator
    return allocator

/* libgpumem_torch: gpumemd as PyTorch's CUDA allocator.
 *
 *   import torch
 *   a = torch.cuda.memory.CUDAPluggableAllocator(
 *           "libgpumem_torch.so.0", "gpumem_torch_alloc", "gpumem_torch_free")
 *   torch.cuda.memory.change_current_allocator(a)   # before the first CUDA tensor
 *
 * (or gpumem.torch.use() from the gpumem Python package). The process holds one
 * session per CUDA device, connected on its first use (gpumem_connect_device():
 * $GPUMEM_SOCKET_TEMPLATE, the device's UUID) and kept until the process
 * exits. Every function is thread-safe. A failed allocation returns NULL, as
 * the pluggable interface expects; its diagnosis is kept for
 * gpumem_torch_last_refusal() and written to stderr once per kind of failure
 * and device (not at all with GPUMEM_TORCH_QUIET=1). */
#ifndef GPUMEM_TORCH_H
#define GPUMEM_TORCH_H

#include <stddef.h>
#include <stdint.h>

#include "gpumem/gpumem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t, without needing CUDA's headers (the same type). */
struct CUstream_st;

/* Devices (process ordinals) the library serves: 0 .. GPUMEM_TORCH_MAX_DEVICES-1. */
#define GPUMEM_TORCH_MAX_DEVICES 64

/* PyTorch's alloc_fn, std::function<void *(size_t, int, cudaStream_t)> in
 * torch/csrc/cuda/CUDAPluggableAllocator.h (memory.py's docstring writes
 * ssize_t: the same register, the same call). `size` bytes for use on
 * `stream` of process device `device`; NULL for size 0 or on failure. */
GPUMEM_EXPORT void *gpumem_torch_alloc(size_t size, int device, struct CUstream_st *stream);

/* PyTorch's free_fn, std::function<void(void *, size_t, int, cudaStream_t)>:
 * PyTorch passes the size, device and stream it allocated with. The block is
 * freed in the order of `stream` (its allocation stream: later allocations on
 * it may reuse it at once, as in PyTorch's own allocator). NULL is ignored. */
GPUMEM_EXPORT void gpumem_torch_free(void *ptr, size_t size, int device, struct CUstream_st *stream);

/* For the pluggable allocator's set_record_stream_fn (C++ users): a later free
 * of ptr also waits for `stream`. */
GPUMEM_EXPORT void gpumem_torch_record_stream(void *ptr, struct CUstream_st *stream);

/* For set_reset_fn (torch.cuda.empty_cache()): every session of the process
 * releases its idle cached memory. */
GPUMEM_EXPORT void gpumem_torch_empty_cache(void);

/* The session of process device `device`, connected on first use; it stays
 * the library's (never disconnect it). On failure gpumem_last_error(NULL)
 * says why, on the calling thread. */
GPUMEM_EXPORT int gpumem_torch_client(int device, gpumem_client **ret);

/* The last refusal on `device`: its negative errno (0: none yet), its
 * diagnosis copied into buf (NUL-terminated, truncated to len) and, when
 * ret_count is not NULL, how many allocations were refused so far. */
GPUMEM_EXPORT int gpumem_torch_last_refusal(int device, char *buf, size_t len, uint64_t *ret_count);

/* A frame hook fills frames[0..max_frames) with the allocating code's stack,
 * innermost first, and returns how many it wrote. It runs in the allocating
 * thread before any lock of the library is taken; its strings must stay
 * valid until it is next called on that thread. */
typedef size_t (*gpumem_frame_hook)(void *userdata, gpumem_frame *frames, size_t max_frames);

/* Installs the hook (NULL removes it). An allocation racing with the change
 * may still call the previous hook once: keep it callable. */
GPUMEM_EXPORT void gpumem_torch_set_frame_hook(gpumem_frame_hook hook, void *userdata);

#ifdef __cplusplus
}
#endif

#endif

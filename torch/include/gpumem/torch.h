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

/* PyTorch's alloc_fn with an out-of-memory PyTorch recognises: as
 * gpumem_torch_alloc, but a refusal throws instead of returning NULL (what
 * gpumem_torch_oom_mode() says), with "CUDA out of memory." and gpumemd's
 * diagnosis as its message. A C++ entry point, exported only when the library
 * is built with a C++ compiler; gpumem.torch.use() installs it when present.
 * Never call it from C. */
GPUMEM_EXPORT void *gpumem_torch_malloc(size_t size, int device, struct CUstream_st *stream);

/* For set_memory_fraction_fn (torch.cuda.set_per_process_memory_fraction):
 * from now on the bytes this library hands out on `device` (live blocks plus
 * the blocks private pools hold) stay within fraction x the daemon's
 * capacity; an allocation past it is refused (NULL, ENOMEM, diagnosis kept).
 * The range is PyTorch's, [0, 1]: 0 refuses every further allocation, 1
 * removes the limit; a fraction outside it is ignored (PyTorch raises
 * ValueError before calling). Enforced here, in the process, not by the
 * daemon: libgpumem's cached segments and other processes are not counted. */
GPUMEM_EXPORT void gpumem_torch_set_memory_fraction(double fraction, int device);

/* The fraction gpumem_torch_set_memory_fraction() set on `device` (1 when
 * none is set or the device is out of range): what
 * torch.cuda.get_per_process_memory_fraction() answers after
 * gpumem.torch.use(). */
GPUMEM_EXPORT double gpumem_torch_memory_fraction(int device);

/* A private pool's id: c10::cuda::MempoolId_t, std::pair<unsigned long long,
 * unsigned long long>, which is passed as this struct is (two registers). */
typedef struct gpumem_torch_pool_id {
        unsigned long long first;
        unsigned long long second;
} gpumem_torch_pool_id;

/* For set_begin_allocate_to_pool: allocations on `device` whose stream
 * `filter` accepts go to private pool `id` until
 * gpumem_torch_end_allocate_to_pool(). Each call is one use of the pool (a
 * CUDA graph capturing into it; graphs may share a pool, as
 * torch.cuda.graph(pool=...) and make_graphed_callables do): the pool lives
 * until gpumem_torch_release_pool() has come once per use. `filter` is PyTorch's
 * std::function<bool(cudaStream_t)> passed by value, that is the address of
 * the caller's object (copied here, before the call returns); NULL (C
 * callers) accepts every stream. A block allocated into a pool and freed
 * while the pool lives is kept here and reused only by that pool's
 * allocations on the stream it was freed on; it goes back to libgpumem when
 * the pool is released. While the pool is allocating, its allocations are
 * assumed to be inside a CUDA graph capture: one the pool's kept blocks
 * cannot serve goes to libgpumem (see gpumem_torch(3), "CUDA graphs", for
 * which libgpumem calls that makes). */
GPUMEM_EXPORT void gpumem_torch_begin_allocate_to_pool(int device, gpumem_torch_pool_id id, const void *filter);

/* For set_end_allocate_to_pool_fn: pool `id` takes no new allocations. */
GPUMEM_EXPORT void gpumem_torch_end_allocate_to_pool(int device, gpumem_torch_pool_id id);

/* For set_release_pool: one use of the pool ends (a graph that captured into
 * it was reset). At the last one the pool's kept blocks go back to libgpumem
 * (freed in the order of the stream each was freed on) and its blocks still
 * in use go back when they are freed; until then the other graphs' replays
 * keep them. An unknown pool is ignored. */
GPUMEM_EXPORT void gpumem_torch_release_pool(int device, gpumem_torch_pool_id id);

/* Bytes private pools of `device` keep for reuse (freed into a live pool). */
GPUMEM_EXPORT uint64_t gpumem_torch_pool_kept_bytes(int device);

/* How an allocation refused through gpumem_torch_malloc() reaches PyTorch:
 * GPUMEM_TORCH_OOM_C10 (c10::OutOfMemoryError, torch.OutOfMemoryError in
 * Python), GPUMEM_TORCH_OOM_RUNTIME_ERROR (a std::runtime_error, RuntimeError
 * in Python: built without PyTorch's headers) or GPUMEM_TORCH_OOM_NULL (no
 * C++ entry point: gpumem_torch_alloc's NULL, which PyTorch 2.11 does not
 * check). */
#define GPUMEM_TORCH_OOM_NULL 0
#define GPUMEM_TORCH_OOM_RUNTIME_ERROR 1
#define GPUMEM_TORCH_OOM_C10 2
GPUMEM_EXPORT int gpumem_torch_oom_mode(void);

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

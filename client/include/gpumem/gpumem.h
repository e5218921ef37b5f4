/* libgpumem: the client library of gpumemd, the per-GPU memory broker.
 *
 * A gpumem_client is one session with the daemon of one GPU. Every function is
 * thread-safe and returns 0 or a negative errno:
 *   -ENOMEM      out of memory (gpumem_last_error() gives the diagnosis)
 *   -EDQUOT      the tenant's quota would be exceeded
 *   -EPERM       not allowed
 *   -EINVAL      bad argument (unknown pointer, double free, size 0, ...)
 *   -ECONNRESET  the daemon is gone
 * On the host backend a pointer is ordinary CPU memory; on cuda it is a device
 * pointer in the calling process's current CUDA context. */
#ifndef GPUMEM_GPUMEM_H
#define GPUMEM_GPUMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPUMEM_EXPORT __attribute__((visibility("default")))
#else
#define GPUMEM_EXPORT
#endif

typedef struct gpumem_client gpumem_client;

/* Connects to the daemon at socket_path; NULL means $GPUMEM_SOCKET, else the
 * default path of GPU 0. On success *ret is a new client. */
GPUMEM_EXPORT int gpumem_connect(const char *socket_path, gpumem_client **ret);

/* Where a session's caching allocator runs. The daemon owns the physical
 * memory, the quotas and the segment ledger in both modes. */
typedef enum gpumem_heap_mode {
        GPUMEM_HEAP_DEFAULT = 0, /* $GPUMEM_HEAP ("local" or "central") if set, else local
                                  * unless the tenant is required to be central */
        GPUMEM_HEAP_LOCAL = 1,   /* in this process: cached allocations and frees send no
                                  * message; -EPERM where the operator requires central */
        GPUMEM_HEAP_CENTRAL = 2, /* in the daemon: one round trip per allocation */
} gpumem_heap_mode;

/* gpumem_connect() with an explicit heap mode (GPUMEM_HEAP_DEFAULT: as gpumem_connect). */
GPUMEM_EXPORT int gpumem_connect_heap(const char *socket_path, gpumem_heap_mode mode, gpumem_client **ret);

/* The mode the session got: GPUMEM_HEAP_LOCAL or GPUMEM_HEAP_CENTRAL. */
GPUMEM_EXPORT gpumem_heap_mode gpumem_heap(gpumem_client *c);

/* Unmaps everything, ends the session (the daemon releases all of its memory)
 * and frees the client. Pointers from it become invalid. Accepts NULL. */
GPUMEM_EXPORT void gpumem_disconnect(gpumem_client *c);

/* Allocates at least `size` bytes for use on `stream` (0 = default stream). */
GPUMEM_EXPORT int gpumem_alloc(gpumem_client *c, size_t size, uint64_t stream, void **ret_ptr);

/* Frees a block; it may be reused at once by allocations on its stream.
 * Refuses unknown pointers and double frees locally with -EINVAL. */
GPUMEM_EXPORT int gpumem_free(gpumem_client *c, void *ptr);

/* Frees a block once the work queued so far on `stream` (and on every stream
 * given to gpumem_record_stream) is done. */
GPUMEM_EXPORT int gpumem_free_async(gpumem_client *c, void *ptr, uint64_t stream);

/* Marks the block as used on `stream`: a later free waits for that stream too. */
GPUMEM_EXPORT int gpumem_record_stream(gpumem_client *c, void *ptr, uint64_t stream);

/* Releases this session's idle cached segments; *ret_released_bytes (may be
 * NULL) receives the bytes given back. */
GPUMEM_EXPORT int gpumem_trim(gpumem_client *c, uint64_t *ret_released_bytes);

/* One statistic of this session by its torch.cuda.memory_stats() name, e.g.
 * "allocated_bytes.all.current". -ENOENT for an unknown name. */
GPUMEM_EXPORT int gpumem_stat(gpumem_client *c, const char *pytorch_stat_name, int64_t *ret_value);

/* Text of a gpumem error code (negative errno). Never NULL. */
GPUMEM_EXPORT const char *gpumem_strerror(int err);

/* The detailed message of the calling thread's last failure on this client
 * (e.g. the out-of-memory diagnosis); "" if none. Valid until the thread's next
 * call on the client. */
GPUMEM_EXPORT const char *gpumem_last_error(gpumem_client *c);

#ifdef __cplusplus
}
#endif

#endif

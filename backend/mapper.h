/* Client-side mapping of segments: each backend reserves a segment's virtual
 * range once, maps physical pieces (fds from the daemon) into it, and unmaps
 * them when the daemon asks. Internal to libgpumem; errors are negative errno. */
#pragma once

#include <stdint.h>

#include "kind.h"

typedef struct gm_mapper gm_mapper_t;

/* sync()'s stream for "all the device's work" (cuCtxSynchronize). */
#define GM_MAPPER_SYNC_DEVICE UINT64_MAX

typedef struct gm_mapper_ops {
        const char *backend;        /* the kind's name, as in HelloReply.backend */
        const gm_kind_caps_t *caps; /* the same record as the kind's daemon half */
        /* Reserves `va_size` bytes of address space; *ret_base is its start. */
        int (*reserve)(gm_mapper_t *m, uint64_t va_size, uint64_t *ret_base);
        /* Maps `length` bytes of the physical memory behind `fd` at base+offset,
         * read-write. The fd is consumed (closed) whether or not this succeeds. */
        int (*map)(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length, int fd);
        /* As map(), read-only (a published shared object): host PROT_READ
         * (the kernel refuses a writable mapping of its sealed memfd), cuda
         * read-only access; a write through it faults. */
        int (*map_read)(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length, int fd);
        /* Unmaps [base+offset, +length), exactly one map()'s range, keeping the
         * reservation. The work using it must be done (see sync). */
        int (*unmap)(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length);
        /* Waits for the work queued so far on `stream` (a CUstream value; 0
         * is the device's default stream; GM_MAPPER_SYNC_DEVICE every stream
         * of the device, non-blocking ones included), so its memory can be
         * unmapped. The stream must still exist (as PyTorch keeps its
         * streams); one the driver no longer knows falls back to the default
         * stream. NULL on backends without device streams. Call it with no
         * connection lock held. */
        int (*sync)(gm_mapper_t *m, uint64_t stream);
        /* Page reuse: moves the mapping at [from, from+length) (exactly one
         * map()'s range) to [to, to+length), unmapped so far inside a
         * reservation: the same physical memory, read-write there and no
         * longer at the old place, which stays reserved. 0, or a negative
         * errno with nothing changed. The work using the old place must be
         * done. */
        int (*move)(gm_mapper_t *m, uint64_t from, uint64_t to, uint64_t length);
        /* Sleep and wake: copy `length` bytes between mapped device memory at
         * `device` and host memory, synchronously (cuMemcpyDtoH/HtoD: after the
         * work queued on the device's default stream; callers that need every
         * stream done sync the device first). 0 or a negative errno. */
        int (*copy_to_host)(gm_mapper_t *m, void *host, uint64_t device, uint64_t length);
        int (*copy_from_host)(gm_mapper_t *m, uint64_t device, const void *host, uint64_t length);
        /* Page-locked host memory for those copies (cuda: cuMemHostAlloc,
         * CU_MEMHOSTALLOC_PORTABLE; the copies run at the bus's bandwidth
         * instead of through the driver's staging buffer): *ret_host is
         * `length` bytes, freed with pinned_free(). A negative errno (-ENOMEM
         * when the driver has no such memory left), nothing allocated. NULL
         * on backends whose host memory needs no pinning (host);
         * -EOPNOTSUPP from a driver without the entry points. pinned_free()
         * accepts NULL. */
        int (*pinned_alloc)(gm_mapper_t *m, uint64_t length, void **ret_host);
        void (*pinned_free)(gm_mapper_t *m, void *host);
        /* Frees the reservation (everything in it is unmapped already). */
        int (*unreserve)(gm_mapper_t *m, uint64_t base, uint64_t va_size);
        /* Stream-ordered frees (NULL on backends without device streams, where
         * work is done when the call returns). event_record marks the work
         * queued so far on `stream` (a CUstream value of any context: the
         * event is made in the stream's own); event_query returns 1 once it is
         * done, 0 while pending, or a negative errno. */
        int (*event_record)(gm_mapper_t *m, uint64_t stream, uint64_t *ret_event);
        int (*event_query)(gm_mapper_t *m, uint64_t event);
        void (*event_destroy)(gm_mapper_t *m, uint64_t event);
        /* Whether `stream` is being captured into a CUDA graph (its capture
         * active or invalidated): 1, 0, or a negative errno. Changes no
         * capture. NULL on backends without device streams (never). */
        int (*capturing)(gm_mapper_t *m, uint64_t stream);
        void (*destroy)(gm_mapper_t *m);
} gm_mapper_ops_t;

struct gm_mapper {
        const gm_mapper_ops_t *ops;
        uint64_t granularity;
};

/* What a client knows of the daemon's memory when it opens its mapper (all
 * from the HelloReply). */
typedef struct gm_mapper_params {
        int device;              /* the daemon's device ordinal */
        const char *device_uuid; /* cuda: the GPU's UUID; NULL or "" when none was sent */
        uint64_t granularity;    /* every piece is a multiple of this */
} gm_mapper_params_t;

/* Opens the client half of memory kind `kind` (HelloReply.backend): the one
 * place a kind is chosen by its name. -EPROTONOSUPPORT for a kind this
 * library does not know; otherwise what the kind's own constructor returns. */
int gm_mapper_open(const char *kind, const gm_mapper_params_t *params, gm_mapper_t **ret);

/* Host backend: mmap(MAP_SHARED) of memfds inside a PROT_NONE reservation,
 * MADV_DONTFORK. */
int gm_mapper_host_new(uint64_t granularity, gm_mapper_t **ret);
/* Cuda backend: cuMemImportFromShareableHandle/cuMemAddressReserve/cuMemMap/
 * cuMemSetAccess on the daemon's device: the one whose UUID is `device_uuid`
 * (this process's own ordinal for it is looked up, whatever its
 * CUDA_VISIBLE_DEVICES; -ENODEV when it cannot see that GPU), or ordinal
 * `device` when device_uuid is NULL or "" (a daemon that sends none).
 * -EOPNOTSUPP in a fork()ed child of a process that used CUDA, -ENOSYS when
 * built without cuda. */
int gm_mapper_cuda_new(int device, const char *device_uuid, uint64_t granularity, gm_mapper_t **ret);

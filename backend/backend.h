/* Memory backends: where a segment's physical memory comes from.
 *
 * Each piece of physical memory is represented in the daemon by one fd that can
 * be passed to a client (a memfd on the host backend, the exported POSIX-fd
 * handle on cuda) plus a backend handle. Errors are negative errno; nothing
 * logs; a failure's detail goes to the caller's reterr buffer. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kind.h"

typedef struct gm_backend gm_backend_t;

typedef struct gm_phys {
        int fd;          /* exportable fd, owned by the daemon until release */
        uint64_t size;   /* bytes */
        uint64_t handle; /* backend-private handle (cuda: CUmemGenericAllocationHandle) */
} gm_phys_t;

typedef struct gm_backend_ops {
        const char *name;           /* "host" or "cuda": for logs, metrics and the HelloReply */
        const gm_kind_caps_t *caps; /* what the kind can do (kind.h) */
        /* Creates `size` bytes (a multiple of granularity). -ENOMEM when the
         * device (or the configured capacity) is full. */
        int (*create)(gm_backend_t *b, uint64_t size, gm_phys_t *ret_phys);
        /* Releases one create()'s memory and closes its fd. */
        void (*release)(gm_backend_t *b, gm_phys_t *phys);
        /* Takes over `fd`, the exported memory of an earlier daemon (kept in
         * systemd's fd store across a restart), as if create() had made it:
         * counts it in in_use and re-imports the handle. The fd is consumed
         * even on failure. -EINVAL when it is not memory of `size` bytes. */
        int (*adopt)(gm_backend_t *b, int fd, uint64_t size, gm_phys_t *ret_phys);
        /* Whether the memory is still mapped writable by some process (the
         * daemon maps none): 1 yes, 0 no, or NULL when the backend cannot
         * tell. Asked only when the memory is on its way out (before a
         * client's word that it unmapped is believed, or once its session
         * is over), never at a daemon's stop: its contents are gone from
         * then on for every holder of the fd (host: punched out of the
         * memfd, then sealed against writes), even when it answers 1. */
        int (*mapped)(gm_backend_t *b, const gm_phys_t *phys);
        /* Makes the memory immutable for every holder of its fd (a published
         * shared object): no write, no resize, ever. -EBUSY while a writable
         * mapping of it remains anywhere (nothing changed). NULL where the
         * kind protects only per mapping (cuda: read-only access). */
        int (*freeze)(gm_backend_t *b, const gm_phys_t *phys);
        /* The driver's figure of the device memory process `pid` holds (its
         * allocations, its context and what it maps, as nvidia-smi lists
         * it); 0 when the driver does not list it. -ENOSYS (or NULL) when the
         * driver cannot tell. */
        int (*process_bytes)(gm_backend_t *b, int pid, uint64_t *ret_bytes);
        /* The driver's text for the calling thread's last failure; NULL
         * for kinds with no driver of their own. */
        const char *(*last_error)(void);
        /* Driver-reported free and total bytes. */
        int (*mem_info)(gm_backend_t *b, uint64_t *ret_free, uint64_t *ret_total);
        void (*destroy)(gm_backend_t *b);
} gm_backend_ops_t;

struct gm_backend {
        const gm_backend_ops_t *ops;
        int device;
        uint64_t capacity;    /* bytes this backend may hand out */
        uint64_t granularity; /* every size is a multiple of this */
        uint64_t in_use;      /* bytes created and not yet released */
        char device_uuid[48]; /* cuda: "GPU-..." as nvidia-smi prints it; host: "" */
        char detail[192];     /* how the backend works here, for the daemon's start-up log */
};

typedef struct gm_backend_options {
        const char *kind;        /* "auto", "cuda" or "host" */
        int device;              /* ordinal */
        const char *device_uuid; /* cuda: select by UUID instead (NULL = by ordinal) */
        uint64_t capacity;       /* 0 = default (host: min(8 GiB, RAM/4); cuda: device total) */
} gm_backend_options_t;

/* Whether `kind` names a backend gm_backend_open() knows ("auto" included). */
bool gm_backend_kind_known(const char *kind);
/* The kinds gm_backend_open() knows, for messages: "auto, cuda or host". */
#define GM_BACKEND_KINDS "auto, cuda or host"

/* Opens the backend `opts->kind` names. For "auto", cuda when a device is
 * usable, else host; *reterr then says which and why. */
int gm_backend_open(const gm_backend_options_t *opts, gm_backend_t **ret_backend, char *reterr, size_t reterr_len);

/* Host backend: memfd segments under a byte capacity. */
int gm_backend_host_open(const gm_backend_options_t *opts, gm_backend_t **ret_backend, char *reterr, size_t reterr_len);
/* Cuda backend: VMM through dlopen'd libcuda. -ENOSYS when built without it. */
int gm_backend_cuda_open(const gm_backend_options_t *opts, gm_backend_t **ret_backend, char *reterr, size_t reterr_len);

static inline int gm_backend_create(gm_backend_t *b, uint64_t size, gm_phys_t *ret_phys) {
        return b->ops->create(b, size, ret_phys);
}
static inline void gm_backend_release(gm_backend_t *b, gm_phys_t *phys) {
        b->ops->release(b, phys);
}
/* Accepts NULL; returns NULL. */
gm_backend_t *gm_backend_close(gm_backend_t *b);

/* The driver's text for the calling thread's last backend failure (e.g.
 * "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"); "" if none. */
const char *gm_backend_last_error(const gm_backend_t *b);

/* Rounds `size` up to a multiple of `granularity` (a power of two or any
 * non-zero value); 0 on overflow. */
uint64_t gm_round_up(uint64_t size, uint64_t granularity);

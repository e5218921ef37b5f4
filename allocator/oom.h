/* Out-of-memory messages: PyTorch's 2.3+ wording and figures, then gpumemd's
 * own diagnosis with a concrete next step.
 *
 * The daemon fills a gm_oom_report_t with the figures at the moment a request
 * fails (after the whole retry ladder), picks the reason with gm_oom_classify()
 * and formats the text with gm_oom_format(). Pure C, no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum gm_oom_reason {
        GM_OOM_QUOTA,         /* the tenant's quota would be exceeded */
        GM_OOM_FRAGMENTATION, /* enough free bytes in the session's cache, no block large enough */
        GM_OOM_DEVICE_FULL,   /* live allocations fill the device */
        GM_OOM_RECLAIM,       /* other tenants' caches could not be reclaimed in time */
        GM_OOM_EXTERNAL,      /* memory used outside the broker */
        _GM_OOM_REASON_MAX,
} gm_oom_reason_t;

/* Every size is in bytes. */
typedef struct gm_oom_report {
        gm_oom_reason_t reason;
        int device; /* device index */
        /* PyTorch's part of the message. */
        uint64_t alloc_size;        /* physical memory that was needed: the new segment's size
                                     * (or the pages to map), PyTorch's "Tried to allocate" */
        uint64_t device_total;      /* device capacity */
        uint64_t device_free;       /* free memory reported by the driver */
        uint64_t allowed;           /* the session's memory-fraction limit on reserved bytes; 0 = none */
        uint64_t session_allocated; /* the session's allocated_bytes (live blocks, pending frees excluded) */
        uint64_t session_reserved;  /* the session's reserved_bytes */
        /* Fragmentation. */
        uint64_t block_size;     /* the rounded block the request needed */
        uint64_t session_cached; /* free (inactive) bytes in the session's cache */
        uint64_t largest_free;   /* the session's largest free block */
        /* Quota. */
        const char *tenant;       /* tenant name; NULL = unknown */
        uint64_t tenant_quota;    /* limit on the tenant's reserved bytes; 0 = none */
        uint64_t tenant_reserved; /* reserved by all of the tenant's sessions */
        uint64_t tenant_live;     /* active (allocated or pending free) in the tenant's sessions;
                                     * the rest of tenant_reserved is cached */
        /* The device as a whole. */
        uint64_t broker_reserved; /* reserved by all sessions on the device */
        uint64_t broker_live;     /* active in all sessions on the device */
        uint64_t others_cached;   /* free bytes cached by other tenants that could not be
                                     * reclaimed in time */
        /* Whom the message is for: an admin may change quotas and trim other
         * tenants, so only an admin is told to. */
        bool caller_admin;
} gm_oom_report_t;

/* Picks the reason from r's figures, first match wins: quota (a quota is set
 * and tenant_reserved + alloc_size exceeds it) > fragmentation (session_cached
 * >= block_size > largest_free) > reclaim (device_free + others_cached would
 * fit alloc_size) > external (device_free + memory used outside the broker
 * would fit alloc_size) > device full. r->reason is ignored. */
gm_oom_reason_t gm_oom_classify(const gm_oom_report_t *r);

/* Writes the message for r (NUL-terminated, no newline) into buf: PyTorch's
 * text, then gpumemd's diagnosis with the next steps the caller can take. A
 * quota refusal leads with the quota instead (PyTorch's device figures would
 * point at the wrong limit), still opening with "CUDA out of memory". Returns
 * its length, -ENOSPC when buf is too small, -EINVAL for an unknown r->reason. */
int gm_oom_format(const gm_oom_report_t *r, char *buf, size_t len);
